"""The tests: a package mirroring the source tree (imported in importlib mode as tests.<package>.<module>)."""
