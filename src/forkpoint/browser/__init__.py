"""browser."""
