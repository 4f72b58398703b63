"""Fixtures of the WebShop env tests: the site's (:mod:`tests.webshop_server.shop_fixtures`)."""

from tests.webshop_server.shop_fixtures import waitress_server  # noqa: F401  (a fixture)
