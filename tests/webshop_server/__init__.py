"""Tests of webshop_server."""
