// A buffer dropped while a queued launch in a scope still borrows it.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = unsafe { device.load_trusted(b"image") }?;
    let kernel = program.kernel("scale")?;
    let queue = device.queue()?;
    let mut x = device.alloc::<f32>(16)?;
    queue.scope(|s| {
        kernel
            .launch(offload::LaunchDims::linear(1, 16))
            .arg(16i32)
            .arg(0.5f32)
            .arg(&mut x)
            .on(s).run()?;
        drop(x);
        Ok(())
    })
}
