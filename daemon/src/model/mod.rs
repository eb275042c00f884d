//! The Kimi K3 forward pass (spec §4): AttnRes schedule, KDA, MLA, router, LatentMoE, head.
