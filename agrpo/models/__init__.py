"""Model helpers: tiny offline models for tests and the smoke recipe."""
