//! The `k3d` crate's modules, as a library so that code outside the binary can reach them:
//! the fuzz targets (`fuzz/targets`) call the HTTP request conversion (`http::body`) exactly
//! as the daemon runs it (issue #19 point 2). `main.rs` only parses and dispatches.
//!
//! The modules, top down (a module uses only those below it; `tests/architecture.rs` fails on
//! a cycle): `cmd` (the subcommands) → `daemon` (`k3d serve`'s lifecycle: start, load,
//! signals, shutdown) → `grpc` and `http` (the two APIs, thin mappings onto the serve core) →
//! `net` (sockets, accept loops, the connection gate, refusals) → `notify`, `logging`, `exit`;
//! `pull` (the Hub client of `k3d pull`) sits under `cmd` beside them and uses only `exit`.

#[macro_use]
pub mod logging;
pub mod cmd;
pub mod daemon;
pub mod exit;
pub mod grpc;
pub mod http;
pub mod net;
pub mod notify;
pub mod pull;
