//! End-to-end tests live beside this file; see `Cargo.toml` for the list.
