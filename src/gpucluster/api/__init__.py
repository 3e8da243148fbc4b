"""HTTP API: validate, call the service, return. No decisions here."""
