//! Two kernels on the same buffers, one after the other: x *= 3, then y += x.

use offload::{LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let device = rt.default_device()?;
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples")) }?;
    let (scale, add) = (program.kernel("scale")?, program.kernel("add")?);

    let n = 10_000;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dx = device.upload(&x)?;
    let mut dy = device.alloc::<f32>(n)?;
    dy.fill(1.0)?;
    let dims = LaunchDims::for_elems(n as u64, 128)?;
    scale
        .launch(dims)
        .arg(n as i32)
        .arg(3.0f32)
        .arg(&mut dx)
        .run()?;
    add.launch(dims).arg(n as i32).arg(&dx).arg(&mut dy).run()?;

    let got = dy.to_vec()?;
    let ok = got
        .iter()
        .enumerate()
        .all(|(i, v)| *v == 3.0 * i as f32 + 1.0);
    println!(
        "scale then add on {device}: {}",
        if ok { "right" } else { "WRONG" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
