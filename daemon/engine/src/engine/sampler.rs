//! Turning logits into the next id: greedy, or seeded temperature / top-k / top-p sampling,
//! optionally among a set of allowed ids only (a guide's mask, see the guide module).
//!
//! The random stream is private to the request (SplitMix64 seeded by `Sampling::seed`), so a
//! request's output depends only on its own seed and logits.

use super::guide::IdSet;
use super::request::Sampling;
use crate::rng::splitmix64;

/// Greedy choice: the first index of the maximum (spec §6.1 rule 12). `None` on a NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            return None;
        }
        if v > logits[best] {
            best = i;
        }
    }
    (!logits.is_empty()).then_some(best as u32)
}

/// Greedy choice among `allowed` ids: the first allowed index of the maximum over them. `None`
/// on a NaN anywhere in the row (the model's failure whatever the mask), or when no allowed id
/// has a logit.
pub fn argmax_among(logits: &[f32], allowed: &IdSet) -> Option<u32> {
    if logits.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut best: Option<u32> = None;
    for id in allowed.iter() {
        let Some(&v) = logits.get(id as usize) else {
            break;
        };
        if best.is_none_or(|b| v > logits[b as usize]) {
            best = Some(id);
        }
    }
    best
}

/// A request's sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(params: Sampling) -> Self {
        let rng = SplitMix64(params.seed);
        Sampler { params, rng }
    }

    /// Chooses the next id from one row of logits, among `allowed` ids only when given. `None`
    /// if the logits contain a NaN, or no allowed id has a logit.
    pub fn sample(&mut self, logits: &[f32], allowed: Option<&IdSet>) -> Option<u32> {
        if self.params.is_greedy() {
            return match allowed {
                None => argmax(logits),
                Some(allowed) => argmax_among(logits, allowed),
            };
        }
        if logits.iter().any(|v| v.is_nan()) {
            return None;
        }
        let order = candidates(logits, self.params.top_k, allowed);
        if order.is_empty() {
            return None;
        }
        let t = self.params.temperature as f64;
        let top = logits[order[0] as usize] as f64;
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| libm::exp((logits[i as usize] as f64 - top) / t))
            .collect();
        let total: f64 = weights.iter().sum();
        // Nucleus: the shortest prefix whose mass reaches top_p.
        let mut keep = weights.len();
        if self.params.top_p < 1.0 {
            let mut mass = 0.0;
            for (n, w) in weights.iter().enumerate() {
                mass += w / total;
                if mass >= self.params.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        let kept_total: f64 = weights[..keep].iter().sum();
        let mut draw = self.rng.next_f64() * kept_total;
        for (n, w) in weights[..keep].iter().enumerate() {
            if draw < *w {
                return Some(order[n]);
            }
            draw -= w;
        }
        Some(order[keep - 1])
    }
}

/// Candidate ids by descending logit, ties to the lower id; only the best `top_k` when it is
/// set (0 = all), of the `allowed` ids when given. With top-k the candidates are partitioned
/// first (O(V)) and only the k kept ids are sorted, instead of sorting the whole vocabulary for
/// every token; the comparator is a total order, so the result is the same as a full sort
/// truncated to k.
fn candidates(logits: &[f32], top_k: usize, allowed: Option<&IdSet>) -> Vec<u32> {
    let better = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut order: Vec<u32> = match allowed {
        None => (0..logits.len() as u32).collect(),
        Some(allowed) => allowed
            .iter()
            .take_while(|&id| (id as usize) < logits.len())
            .collect(),
    };
    if top_k > 0 && top_k < order.len() {
        order.select_nth_unstable_by(top_k - 1, better);
        order.truncate(top_k);
    }
    order.sort_unstable_by(better);
    order
}

/// SplitMix64 (the synthesizer's fully specified step): tiny, fast, identical on every
/// platform.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[1.0, f32::NAN]), None);
    }

    #[test]
    fn same_seed_same_draws_different_seed_different_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = Sampling {
            temperature: 1.0,
            top_p: 0.95,
            top_k: 0,
            seed: 7,
        };
        let run = |p: Sampling| {
            let mut s = Sampler::new(p);
            (0..40)
                .map(|_| s.sample(&logits, None).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(p.clone()), run(p.clone()));
        assert_ne!(run(p.clone()), run(Sampling { seed: 8, ..p }));
    }

    #[test]
    fn top_k_candidates_equal_the_full_order_truncated() {
        // Many ties (a coarse grid of values) so the id tie-break is exercised.
        let logits: Vec<f32> = (0..500u32)
            .map(|i| ((i * 7919) % 23) as f32 * 0.5)
            .collect();
        let full = candidates(&logits, 0, None);
        assert!(full.windows(2).all(|w| {
            let (a, b) = (logits[w[0] as usize], logits[w[1] as usize]);
            a > b || (a == b && w[0] < w[1])
        }));
        for k in [1, 2, 17, 23, 499, 500, 800] {
            assert_eq!(
                candidates(&logits, k, None),
                full[..k.min(500)],
                "top_k {k}"
            );
        }
    }

    /// A sampler at `temperature` with top-k `top_k` and no nucleus.
    fn hot(temperature: f32, top_k: usize, seed: u64) -> Sampler {
        Sampler::new(Sampling {
            temperature,
            top_p: 1.0,
            top_k,
            seed,
        })
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.1f32, 2.0, 1.9, -1.0];
        let mut s = hot(5.0, 1, 3);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, None), Some(1));
        }
    }

    #[test]
    fn a_mask_keeps_the_best_allowed_id_and_draws_only_allowed_ids() {
        let logits = [0.1f32, 2.0, 1.9, -1.0, 1.9];
        let mut allowed = IdSet::new(logits.len());
        allowed.insert(2);
        allowed.insert(3);
        allowed.insert(4);
        // Greedy: the first maximum among the allowed ids (2 before the equal 4).
        assert_eq!(argmax_among(&logits, &allowed), Some(2));
        let mut greedy = Sampler::new(Sampling::default());
        assert_eq!(greedy.sample(&logits, Some(&allowed)), Some(2));
        assert_eq!(greedy.sample(&logits, None), Some(1));
        // A NaN anywhere is the model's failure, masked or not.
        assert_eq!(argmax_among(&[f32::NAN, 1.0, 2.0], &allowed), None);
        let mut hot = hot(3.0, 0, 11);
        for _ in 0..200 {
            let id = hot.sample(&logits, Some(&allowed)).unwrap();
            assert!(allowed.contains(id), "{id}");
        }
        // Masked candidates are the full order with the disallowed ids removed.
        let full = candidates(&logits, 0, None);
        let kept: Vec<u32> = full.into_iter().filter(|&i| allowed.contains(i)).collect();
        assert_eq!(candidates(&logits, 0, Some(&allowed)), kept);
        assert_eq!(candidates(&logits, 2, Some(&allowed)), kept[..2]);
    }
}
