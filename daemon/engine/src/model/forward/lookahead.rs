//! The routing lookahead (plan rule 4, issue 16): guessing which experts a MoE layer will
//! route to before its mixer (or, across the dense layer, before the layer ahead) runs, so
//! their reads overlap compute. A guess decides only which reads start early, never a computed
//! value.

use super::*;

impl Model {
    /// Routing lookahead (plan rule 4): starts reading the experts MoE layer `l` (router and
    /// parameters `moe`) would pick if its mixer added nothing to the residual — its router on
    /// the AttnRes mix of what is known before the mixer runs: `blocks`, and `partial` the
    /// running block sum (`None` right after a block start). The reads then run while the mixer
    /// computes instead of after routing. The guess decides only which reads start early,
    /// never a computed value.
    ///
    /// Measured on `bench` at 8.5 GiB (12 tokens): 92–99 % of each layer's 16 experts guessed
    /// right, ~100 % of the 8 most confident. Guessing further ahead across the dense layer 0
    /// is [`Model::read_across_dense`].
    pub(super) fn read_ahead(
        &self,
        l: usize,
        moe: (&MoeParams, &MoeMatrices<'_>),
        blocks: &[Vec<f32>],
        partial: Option<&[f32]>,
        rows: usize,
    ) -> Result<Option<ExpertPrefetch<'_>>, ModelError> {
        let slots = self.store.plan().lookahead_slots;
        if slots == 0 || rows * self.dims.moe.router.top_k > slots {
            return Ok(None);
        }
        let (h, eps) = (self.config.hidden_size, self.config.rms_norm_eps);
        let zeros;
        let partial = match partial {
            Some(p) => p,
            None => {
                zeros = vec![0.0f32; rows * h];
                &zeros
            }
        };
        let vectors = &self.layers[l].vectors;
        let mix = aggregate_rows(blocks, partial, &vectors.mlp_res, eps, h);
        let x = norm_rows(&mix, &vectors.post_norm, eps, h);
        let (p, m) = moe;
        let guess = moe::predict(&self.dims.moe, m, p, &x)?;
        Ok(self.store.prefetch_experts(l, &guess)?)
    }

    /// Routing lookahead across a dense layer (issue 16, plan `dense_lookahead`): while dense
    /// layer `l` computes, starts reading the experts MoE layer `l + 1` would pick if every
    /// sub-layer from here to its MoE added nothing — [`Model::read_ahead`] on the state it
    /// would then see: `blocks`, plus `cur_next` (the running block sum known now, `None`
    /// for zero) banked if `l + 1` starts a block, else as its running sum. `None` when `l + 1`
    /// is not MoE or its trunk is not pinned (the plan grants lookahead slots only when every
    /// layer is). The layer `l + 1` then makes no guess of its own: the slots are taken.
    ///
    /// Measured (issue 16, `tests/fixtures/trained/README.md`), share of layer 1's routing
    /// guessed: on the trained fixture model 96.5–96.9 % from layer 0's input, 66.5–67.3 % from
    /// its MLP's input, 98.8–99.2 % by layer 1's own guess before its mixer; on random weights
    /// 73–76 % (`tiny`, `tiny-b`) and 67 % / 55 % (`bench`, where the MLP-input guess read 6–11 %
    /// more bytes per token and gained no speed). From the input, at K3 sizes 272 of layer 1's
    /// 281 MB per token start while the dense layer computes and the drive would idle, for
    /// +6.5 MB of wrong guesses and as many read after routing: hence the default `input`.
    pub(super) fn read_across_dense(
        &self,
        l: usize,
        blocks: &[Vec<f32>],
        cur_next: Option<&[f32]>,
        rows: usize,
    ) -> Result<Option<ExpertPrefetch<'_>>, ModelError> {
        let next = l + 1;
        let (
            Some(LayerParams {
                ffn: FfnParams::Moe(p),
                ..
            }),
            Some(FfnLayout::Moe(ml)),
            Some(run),
        ) = (
            self.layers.get(next),
            self.store.layout().layers.get(next).map(|ll| &ll.ffn),
            self.store.pinned_trunk(next),
        )
        else {
            return Ok(None);
        };
        let binder = Binder {
            config: &self.config,
            dims: &self.dims,
        };
        let m = binder.moe(next, ml, &Trunk::Whole(run))?;
        if is_block_start(next, self.config.attn_res_block_size) {
            let mut banked = blocks.to_vec();
            banked.push(cur_next.map_or_else(
                || vec![0.0; rows * self.config.hidden_size],
                <[f32]>::to_vec,
            ));
            self.read_ahead(next, (p, &m), &banked, None, rows)
        } else {
            self.read_ahead(next, (p, &m), blocks, cur_next, rows)
        }
        .map(|guess| guess.map(ExpertPrefetch::early))
    }
}
