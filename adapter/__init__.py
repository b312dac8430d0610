"""The holdwarden adapter: the library the supervisor calls to place and lift holds."""
