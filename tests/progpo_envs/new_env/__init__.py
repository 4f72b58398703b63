"""A new env added the documented way (docs/adding_an_environment.md), and its test."""
