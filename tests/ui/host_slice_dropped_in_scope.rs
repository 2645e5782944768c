// Host memory a queued copy reads, dropped inside the queue scope that borrows it.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let queue = device.queue()?;
    let x = device.alloc::<f32>(16)?;
    queue.scope(|s| {
        let host = vec![1.0f32; 16];
        s.write(&x, &host)?;
        drop(host);
        Ok(())
    })
}
