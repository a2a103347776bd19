//! `specmla make-bench-model --from DIR --out DIR [--factor H,I,G]`: a function-preserving
//! widened copy of a checkpoint (hidden x H, MLP / expert units x I, heads x G), the
//! memory-bound benchmark target of the speculation bench (see `specmla::weights::widen_dir`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use specmla::weights::WidenFactors;
use specmla::{Error, Result};

#[derive(Args)]
pub struct MakeBenchModelArgs {
    /// Source checkpoint directory (float weights), e.g. models/target.
    #[arg(long)]
    pub from: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Factors HIDDEN,INTERMEDIATE,HEADS[,SHARED] (powers of two): INTERMEDIATE widens the
    /// routed experts, SHARED (default = INTERMEDIATE) the dense MLPs and shared experts.
    #[arg(long, default_value = "8,4,4")]
    pub factor: String,
}

/// "8,4,4" -> factors.
pub fn parse_factors(s: &str) -> Result<WidenFactors> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::InvalidArgument(format!("--factor {s}: {e}")))?;
    match v[..] {
        [hidden, intermediate, heads] => Ok(WidenFactors::uniform(hidden, intermediate, heads)),
        [hidden, intermediate, heads, shared] => Ok(WidenFactors {
            hidden,
            intermediate,
            heads,
            shared,
        }),
        _ => Err(Error::InvalidArgument(format!(
            "--factor {s}: want HIDDEN,INTERMEDIATE,HEADS[,SHARED]"
        ))),
    }
}

pub fn run(a: MakeBenchModelArgs) -> Result<()> {
    let t = Instant::now();
    let f = parse_factors(&a.factor)?;
    let r = specmla::weights::widen_dir(&a.from, &a.out, f)?;
    println!(
        "widened {} tensors (hidden x{}, expert units x{}, heads x{}, dense / shared units x{}): {:.1} MB -> {:.1} MB in {} shards, {:.1} s: {}",
        r.tensors,
        f.hidden,
        f.intermediate,
        f.heads,
        f.shared,
        r.bytes_in as f64 / 1e6,
        r.bytes_out as f64 / 1e6,
        r.shards,
        t.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}
