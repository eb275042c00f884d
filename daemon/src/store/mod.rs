//! Where weight bytes live: reads from the shards, pinned trunk layers, the expert cache.
