//! y = a*x + y on the default device (a GPU if there is one, else the host), checked.

use offload::{LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let device = rt.default_device()?;
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples")) }?;

    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let dx = device.upload(&x)?;
    let mut dy = device.upload(&y)?;
    program
        .kernel("saxpy")?
        .launch(LaunchDims::for_elems(n as u64, 256)?)
        .arg(n as i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()?;
    let got = dy.to_vec()?;

    let wrong = (0..n).filter(|&i| got[i] != 2.0 * x[i] + y[i]).count();
    println!("saxpy on {device}: {} of {n} elements right", n - wrong);
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
