//! A sum by blocks in block-shared memory with barriers (`OFFLOAD_SHARED`,
//! `offload_barrier`), then the block sums added on the host. Integer sums: exact.

use offload::{LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let device = rt.default_device()?;
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples")) }?;
    let n = 1_000_003usize;
    let block = 256u32;
    let blocks = n.div_ceil(2 * block as usize);
    let data: Vec<u32> = (0..n as u32).map(|i| i % 1013).collect();
    let din = device.upload(&data)?;
    let mut dout = device.alloc::<u32>(blocks)?;
    program
        .kernel("block_sum")?
        .launch(LaunchDims::linear(blocks as u32, block))
        .arg(n as i32)
        .arg(blocks as i32)
        .arg(&din)
        .arg(&mut dout)
        .run()?;
    let sum: u64 = dout.to_vec()?.iter().map(|v| u64::from(*v)).sum();
    let want: u64 = data.iter().map(|v| u64::from(*v)).sum();
    println!("sum of {n} values over {blocks} blocks on {device}: {sum} (expected {want})");
    if sum != want {
        std::process::exit(1);
    }
    Ok(())
}
