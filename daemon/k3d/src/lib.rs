//! The `k3d` crate's modules, as a library so that code outside the binary can reach them:
//! the fuzz targets (`fuzz/targets`) call the HTTP request conversion (`http::request`) exactly
//! as the daemon runs it (issue #19 point 2). `main.rs` only parses and dispatches.

pub mod cmd;
pub mod exit;
pub mod http;
pub mod notify;
pub mod server;
