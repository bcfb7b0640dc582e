"""The admin console: web pages at /admin over the admin API's service calls (docs/admin-console.md)."""
