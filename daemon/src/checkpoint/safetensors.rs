//! safetensors shard headers → one validated tensor index (spec §3.1–§3.2).

/// Element types the engine knows. K3 uses exactly these three (spec §3.2 rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bf16,
    F32,
    U8,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::U8 => 1,
        }
    }
}
