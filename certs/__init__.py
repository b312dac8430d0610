"""CA and serving certificates for the holdwarden enforcer."""
