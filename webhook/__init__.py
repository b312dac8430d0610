"""Admission enforcer for holdwarden holds."""
