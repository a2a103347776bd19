//! `specmla bench` (filled in below).
use clap::Args;
use specmla::Result;

#[derive(Args)]
pub struct BenchArgs {}

pub fn run(_a: BenchArgs) -> Result<()> {
    Ok(())
}
