//! The MoE feed-forward on the device: routed experts grouped (one launch per stage for all
//! assignments) or expert by expert, the shared experts, and the SwiGLU MLP. Routing itself runs
//! on the host (`model::moe::route`). Part of [`super::CudaBackend`].

use super::*;

impl CudaBackend {
    /// y[a, rows] = W[g[a]] · x[a] for A items; W: [G, rows, cols] f32 on the device.
    pub(super) fn gemm_grouped(
        &self,
        w: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        x: &CudaSlice<f32>,
        groups: &CudaSlice<i32>,
        items: usize,
    ) -> Result<CudaSlice<f32>> {
        let mut y = self.zeros(items * rows)?; // [A, rows]
        let (r, c) = (rows as i32, cols as i32);
        // grid.y is at most 65535: long prompts go in passes of ITEMS items
        const ITEMS: usize = 32768;
        for a0 in (0..items).step_by(ITEMS) {
            let m = ITEMS.min(items - a0);
            let xv = x.slice(a0 * cols..(a0 + m) * cols);
            let gv = groups.slice(a0..a0 + m);
            let mut yv = y.slice_mut(a0 * rows..(a0 + m) * rows);
            let mut b = self.s().launch_builder(self.gpu.func("gemm_grouped_f32")?);
            b.arg(w).arg(&xv).arg(&gv).arg(&mut yv).arg(&r).arg(&c);
            // SAFETY: kernels/gemm_f32.cu's signature; every g[a] < G (built by the caller).
            unsafe { b.launch(grid((rows.div_ceil(8) as u32, m as u32, 1), 256)) }.map_err(drv)?;
        }
        Ok(y)
    }

    /// Routed experts of `m` for xn [n, hidden] with the host's routing. -> ([n, hidden], bytes)
    pub(super) fn moe(
        &self,
        cfg: &ModelConfig,
        m: &Moe,
        xn: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(CudaSlice<f32>, usize)> {
        let moe_cfg = cfg
            .moe
            .as_ref()
            .ok_or_else(|| Error::Engine("MoE layer without MoE config".into()))?;
        let h = cfg.hidden_size;
        let ne = m.experts.len();
        // router logits on the device (f32 router), selection on the host (the CPU's code)
        let router = self
            .routers
            .get(&(m.gate.as_ptr() as usize))
            .ok_or_else(|| Error::Engine("CUDA backend: a router is not on the device".into()))?;
        let lg = self.gemm_dev(router, xn, n)?; // [n, E]
        let logits = self.s().clone_dtoh(&lg).map_err(drv)?; // [n, E]
        let k = moe_cfg.num_experts_per_tok;
        let (mut tok, mut ex, mut wt) = (Vec::new(), Vec::new(), Vec::new());
        let mut active = vec![false; ne]; // [E]
        for t in 0..n {
            let r = route(
                moe_cfg,
                cfg.model_type,
                &logits[t * ne..(t + 1) * ne],
                m.bias.as_deref(),
            );
            if r.len() != k {
                return Err(Error::Engine(format!(
                    "routing gave {} experts, want {k}",
                    r.len()
                )));
            }
            for (e, w) in r {
                tok.push(t as i32);
                ex.push(e as i32);
                wt.push(w);
                active[e] = true;
            }
        }
        let active: Vec<usize> = (0..ne).filter(|&e| active[e]).collect();
        let bytes = crate::model::moe::weight_bytes(m, &active);
        let Some(de) = self.experts.get(&key(m)) else {
            let out = self.moe_per_expert(m, xn, n, &tok, &ex, &wt)?;
            return Ok((out, bytes));
        };
        let na = tok.len();
        let (dt, dex, dw) = (self.up(&tok)?, self.up(&ex)?, self.up(&wt)?);
        let mut hid = self.zeros(na * de.inter)?; // [A, inter]
        let mut y = self.zeros(na * h)?; // [A, hidden]
        let mut out = self.zeros(n * h)?; // [n, hidden]
        let (hh, ii, kk) = (h as i32, de.inter as i32, k as i32);
        let s = self.s();
        // grid.y is at most 65535: long prompts go in passes of ITEMS assignments
        const ITEMS: usize = 32768;
        for a0 in (0..na).step_by(ITEMS) {
            let m = ITEMS.min(na - a0);
            let (tv, ev) = (dt.slice(a0..a0 + m), dex.slice(a0..a0 + m));
            let mut hv = hid.slice_mut(a0 * de.inter..(a0 + m) * de.inter);
            let mut b = s.launch_builder(self.gpu.func("moe_gate_up_bf16")?);
            b.arg(&de.gate)
                .arg(&de.up)
                .arg(xn)
                .arg(&tv)
                .arg(&ev)
                .arg(&mut hv)
                .arg(&hh)
                .arg(&ii);
            // SAFETY: kernels/moe_experts.cu's signature; expert ids < E (the router's).
            unsafe { b.launch(grid((de.inter.div_ceil(8) as u32, m as u32, 1), 256)) }
                .map_err(drv)?;
            let hv = hid.slice(a0 * de.inter..(a0 + m) * de.inter);
            let mut yv = y.slice_mut(a0 * h..(a0 + m) * h);
            let mut b = s.launch_builder(self.gpu.func("moe_down_bf16")?);
            b.arg(&de.down)
                .arg(&hv)
                .arg(&ev)
                .arg(&mut yv)
                .arg(&hh)
                .arg(&ii);
            // SAFETY: as above.
            unsafe { b.launch(grid((h.div_ceil(8) as u32, m as u32, 1), 256)) }.map_err(drv)?;
        }
        let mut b = s.launch_builder(self.gpu.func("moe_combine")?);
        b.arg(&y).arg(&dw).arg(&mut out).arg(&hh).arg(&kk);
        // SAFETY: as above; exactly k assignments per token, token-major.
        unsafe { b.launch(grid(g1(n), 256)) }.map_err(drv)?;
        if let Some(sh) = &m.shared {
            let ys = self.mlp(sh, xn, n)?;
            self.add(&mut out, &ys, n * h)?;
        }
        Ok((out, bytes))
    }

    /// Routed experts one by one (experts not stacked: fp8 blocks, f16, ...): each expert's
    /// tokens gathered, its MLP through the small-n GEMMs, added into its tokens' rows with the
    /// routing weight — experts in ascending id, so each token's sum keeps the slot order — then
    /// the shared experts. tok / ex / wt: the assignments, token-major. -> [n, hidden]
    pub(super) fn moe_per_expert(
        &self,
        m: &Moe,
        xn: &CudaSlice<f32>,
        n: usize,
        tok: &[i32],
        ex: &[i32],
        wt: &[f32],
    ) -> Result<CudaSlice<f32>> {
        let h = m.experts.first().map_or(0, |e| e.gate.cols);
        let mut out = self.zeros(n * h)?; // [n, hidden]
        let hw = h as i32;
        for e in 0..m.experts.len() {
            let (idx, w): (Vec<i32>, Vec<f32>) = (0..ex.len())
                .filter(|&a| ex[a] as usize == e)
                .map(|a| (tok[a], wt[a]))
                .unzip();
            if idx.is_empty() {
                continue;
            }
            let k = idx.len();
            let (didx, dw) = (self.up(&idx)?, self.up(&w)?);
            let mut xe = self.zeros(k * h)?; // [k, hidden]
            let mut b = self.s().launch_builder(self.gpu.func("gather_rows_f32")?);
            b.arg(xn).arg(&didx).arg(&mut xe).arg(&hw);
            // SAFETY: kernels/elementwise.cu's signature; token ids < n.
            unsafe { b.launch(grid(g1(k), 128)) }.map_err(drv)?;
            let ye = self.mlp(&m.experts[e], &xe, k)?; // [k, hidden]
            let mut b = self.s().launch_builder(self.gpu.func("axpy_rows_f32")?);
            b.arg(&mut out).arg(&ye).arg(&didx).arg(&dw).arg(&hw);
            // SAFETY: as above; a token appears once per expert.
            unsafe { b.launch(grid(g1(k), 128)) }.map_err(drv)?;
        }
        if let Some(sh) = &m.shared {
            let ys = self.mlp(sh, xn, n)?;
            self.add(&mut out, &ys, n * h)?;
        }
        Ok(out)
    }

    /// down(silu(gate(x)) * up(x)). x: [n, hidden] -> [n, hidden]
    pub(super) fn mlp(&self, e: &Expert, x: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<f32>> {
        let g = self.gemm(&e.gate, x, n)?; // [n, inter]
        let u = self.gemm(&e.up, x, n)?; // [n, inter]
        let len = n * e.gate.rows;
        let mut act = self.zeros(len)?; // [n, inter]
        let l = len as i32;
        let mut b = self.s().launch_builder(self.gpu.func("silu_mul_f32")?);
        b.arg(&g).arg(&u).arg(&mut act).arg(&l);
        // SAFETY: kernels/elementwise.cu's signature.
        unsafe { b.launch(grid(g1(len.div_ceil(256)), 256)) }.map_err(drv)?;
        self.gemm(&e.down, &act, n)
    }
}
