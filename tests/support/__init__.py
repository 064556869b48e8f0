"""What the tests share: helpers and fixtures, one module per job (tests import them as `support.<module>`)."""
