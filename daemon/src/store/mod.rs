//! Where weight bytes live: reads from the shards, pinned trunk layers, the expert cache.

pub mod aligned;
pub mod direct_io;
pub mod expert_cache;
pub mod plan;
pub mod reader;
