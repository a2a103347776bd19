//! `specmla quantize --model DIR --out DIR`: fp8 e4m3 copy with 128x128 block scales (the
//! official DeepSeek-V3 layout; see `specmla::weights::quantize_dir`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use specmla::Result;

#[derive(Args)]
pub struct QuantizeArgs {
    /// Source checkpoint directory (f32 / bf16 / f16 weights).
    #[arg(long)]
    pub model: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Block size of the scales (rows and columns).
    #[arg(long, default_value_t = 128)]
    pub block: usize,
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let t = Instant::now();
    let r = specmla::weights::quantize_dir(&a.model, &a.out, a.block)?;
    println!(
        "quantized {} tensors to fp8 e4m3 ({}x{} blocks), kept {}; {:.1} MB -> {:.1} MB in {:.1} s: {}",
        r.quantized,
        a.block,
        a.block,
        r.kept,
        r.bytes_in as f64 / 1e6,
        r.bytes_out as f64 / 1e6,
        t.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}
