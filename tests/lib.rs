//! Shared helpers for the end-to-end tests in `tests/e2e/`.
