"""WebShop in a real browser: the same episodes as ``progpo/WebShop-v0``, driven through Selenium and headless
Chromium against a running ``progpo webshop serve``.

This is for evaluation and demonstrations (one action takes ~0.1–0.4 s, 100–1000× slower than the in-process
env), and it checks that the site a person sees is the site the agents are scored on. Observations and
clickables are read from the browser's DOM with upstream's rules
(``web_agent_site/envs/web_agent_site_env.py`` and ``get_available_actions``: visible texts joined by ``"
[SEP] "``; ``.btn`` texts, ``.product-link`` texts and radio values), so for the same goal and actions they
equal the in-process env's ``text`` observations, and the purchase score is read from the done page's
``#reward``.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium chromium-driver``);
Selenium is pointed at ``/usr/bin/chromedriver`` so Selenium Manager never downloads a driver.

Example:
    >>> from progpo_envs.webshop.browser import WebShopBrowserEnv  # doctest: +SKIP
    >>> env = WebShopBrowserEnv(url="http://127.0.0.1:3000", split="test")  # doctest: +SKIP
    >>> obs, info = env.reset(options={"task_index": 0})  # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step("search[blue socks]")  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from bs4 import BeautifulSoup, Comment

from progpo_envs.core.text_env import EngineStep, TaskStart, TextEnv
from progpo_envs.webshop.env import (
    DEFAULT_MAX_STEPS,
    SUCCESS_REWARD,
    HttpBackend,
    RewardMode,
    WebShopEnv,
    step_info,
)
from webshop_server.engine import ObservationMode, Split, parse_action, split_range

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Flags for an offline, reproducible headless Chromium (docs/webshop.md §5).
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1024",
)
_INVISIBLE_PARENTS = {"style", "script", "head", "title", "meta", "[document]"}


def chromium_available() -> bool:
    """Whether Debian's chromium and chromedriver are installed."""
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def html_to_text(html: str) -> str:
    """Upstream's ``convert_html_to_text(simple=True)``: visible texts, stripped, joined by ``" [SEP] "``."""
    soup = BeautifulSoup(html, "html.parser")
    texts = []
    for node in soup.find_all(string=True):
        if node.parent.name in _INVISIBLE_PARENTS or isinstance(node, Comment) or not node.strip():
            continue
        texts.append(" ".join(node.split()))
    return " [SEP] ".join(texts)


def html_available_actions(html: str) -> dict[str, Any]:
    """Upstream's ``get_available_actions`` on a page's HTML."""
    soup = BeautifulSoup(html, "html.parser")
    clickables = [b.get_text().strip().lower() for b in soup.select(".btn")]
    clickables += [a.get_text().strip().lower() for a in soup.select(".product-link")]
    clickables += [r.get("value", "").lower() for r in soup.select("input[type=radio]")]
    return {"has_search_bar": soup.find(id="search_input") is not None, "clickables": clickables}


class WebShopBrowserEnv(TextEnv):
    """``progpo/WebShop-v0`` through a real browser (see the module docstring).

    Args:
        url: Base URL of a running server (start it with ``--expose-expert`` to use ``expert=True``).
        split: ``"test"``, ``"train"`` or ``"all"``.
        observation_mode: ``"text"`` or ``"html"`` (upstream's Selenium env offered these two).
        reward_mode, success_reward, max_steps: As in :class:`~progpo_envs.webshop.env.WebShopEnv`.
        expert: Put the server's expert action in ``info["expert_action"]``.
        page_timeout_s: Longest wait for a page to load after an action.
    """

    metadata = WebShopEnv.metadata

    @classmethod
    def split_names(cls, **kwargs: Any) -> tuple[str, ...]:
        """WebShop's splits (:meth:`WebShopEnv.split_names`)."""
        return WebShopEnv.split_names(**kwargs)

    def __init__(
        self,
        *,
        url: str,
        split: Split | str = Split.TRAIN,
        observation_mode: ObservationMode | str = ObservationMode.TEXT,
        reward_mode: RewardMode | str = RewardMode.SUCCESS,
        success_reward: float = SUCCESS_REWARD,
        expert: bool = False,
        max_steps: int = DEFAULT_MAX_STEPS,
        page_timeout_s: float = 15.0,
        render_mode: str | None = None,
    ):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        self.observation_mode = ObservationMode(observation_mode)
        if self.observation_mode not in (ObservationMode.TEXT, ObservationMode.HTML):
            raise ValueError("the browser env observes 'text' or 'html'")
        self.url = url.rstrip("/")
        self.reward_mode = RewardMode(reward_mode)
        self.success_reward = float(success_reward)
        self.expert = bool(expert)
        self.page_timeout_s = page_timeout_s
        self._api = HttpBackend(self.url)
        self._goals = split_range(Split(split), self._api.num_goals)
        self._sid: str | None = None
        self._goal_index = -1
        self._driver = None
        self._profile_dir: str | None = None

    @property
    def num_tasks(self) -> int:
        """Goals in the selected split."""
        return len(self._goals)

    def _browser(self):
        if self._driver is None:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service

            if not chromium_available():
                raise RuntimeError("chromium not found: apt-get install -y chromium chromium-driver")
            self._profile_dir = tempfile.mkdtemp(prefix="webshop-chromium-")
            options = webdriver.ChromeOptions()
            options.binary_location = CHROMIUM
            for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={self._profile_dir}"):
                options.add_argument(flag)
            self._driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
            self._driver.set_page_load_timeout(self.page_timeout_s)
        return self._driver

    # --- TextEnv --------------------------------------------------------------------------------------------
    def _start_task(self, task_index: int) -> TaskStart:
        if self._sid is not None:
            self._api.close_session(self._sid)
        self._goal_index = self._goals[task_index]
        self._sid, _ = self._api.create(self._goal_index)
        self._navigate(lambda d: d.get(f"{self.url}/{self._sid}"))
        return TaskStart(
            self._observation(),
            f"webshop:{self._api.fingerprint}:{self._goal_index}",
            self._info(valid=True, score=0.0, done=False),
        )

    def _engine_step(self, action: str) -> EngineStep:
        name, arg = parse_action(action)
        available = html_available_actions(self._browser().page_source)
        valid = False
        if name == "search" and arg and arg.strip() and available["has_search_bar"]:
            self._navigate(lambda d: self._search(d, arg.lower()))
            valid = True
        elif name == "click" and arg is not None:
            target = arg.strip().lower()
            element = self._find_clickable(target) if target != "search" else None
            if element is not None:
                self._navigate(lambda d: element.click())
                valid = True
        score, done = self._score()
        if self.reward_mode is RewardMode.SUCCESS:
            reward = self.success_reward if done and score == 1.0 else 0.0
        else:
            reward = score if done else 0.0
        return EngineStep(self._observation(), reward, done, self._info(valid=valid, score=score, done=done))

    def _invalid_action_step(self) -> EngineStep:
        return EngineStep(self._observation(), 0.0, False, self._info(valid=False, score=0.0, done=False))

    # --- browser helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _search(driver, query: str) -> None:
        from selenium.webdriver.common.by import By

        box = driver.find_element(By.ID, "search_input")
        box.clear()
        box.send_keys(query)
        driver.find_element(By.CSS_SELECTOR, ".btn-search").click()

    def _find_clickable(self, target: str):
        from selenium.webdriver.common.by import By

        driver = self._browser()
        for selector in (".btn", ".product-link"):
            for element in driver.find_elements(By.CSS_SELECTOR, selector):
                if element.text.strip().lower() == target:
                    return element
        for element in driver.find_elements(By.CSS_SELECTOR, "a.option-link"):
            if (element.get_attribute("data-value") or "").lower() == target:
                return element
        return None

    def _navigate(self, act) -> None:
        """Do ``act`` and wait until the browser has loaded the next page."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        def old_page_gone(_driver) -> bool:
            # Mid-navigation chromedriver may report the old node as stale or as "not in the document".
            try:
                old_page.is_enabled()
                return False
            except WebDriverException:
                return True

        driver = self._browser()
        old_page = driver.find_element(By.TAG_NAME, "html")
        act(driver)
        WebDriverWait(driver, self.page_timeout_s).until(old_page_gone)
        # Every page of the shop (error pages included) draws inside .container.
        WebDriverWait(driver, self.page_timeout_s).until(
            lambda d: (
                d.execute_script("return document.readyState") == "complete"
                and d.find_elements(By.CSS_SELECTOR, ".container")
            )
        )

    def _score(self) -> tuple[float, bool]:
        from selenium.webdriver.common.by import By

        rewards = self._browser().find_elements(By.CSS_SELECTOR, "#reward pre")
        return (float(rewards[0].text), True) if rewards else (0.0, False)

    def _observation(self) -> str:
        html = self._browser().page_source
        return html if self.observation_mode is ObservationMode.HTML else html_to_text(html)

    def _info(self, *, valid: bool, score: float, done: bool) -> dict[str, Any]:
        available = html_available_actions(self._browser().page_source)
        expert_action = (lambda: self._api.expert_action(self._sid)) if self.expert else None
        return step_info(
            available,
            valid=valid,
            score=score,
            done=done,
            goal_index=self._goal_index,
            expert_action=expert_action,
        )

    def close(self) -> None:
        """Quit the browser, close the session and remove the browser profile (safe to call twice)."""
        if self._driver is not None:
            try:
                self._driver.quit()
            finally:
                self._driver = None
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None
        if self._sid is not None:
            self._api.close_session(self._sid)
            self._sid = None
        self._api.close()
        super().close()
