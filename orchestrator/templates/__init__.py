"""Sandbox templates: images an admin defines as layers over the default workbench (docs/templates.md)."""
