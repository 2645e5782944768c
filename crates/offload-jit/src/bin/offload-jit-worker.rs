//! The JIT worker process: the only executable that links LLVM. Started by the JIT client
//! (`offload-jit-client`) on a process's first compile; see `offload_jit::serve`.

fn main() {
    let status = offload_jit::serve::worker_main();
    // SAFETY: ends the process without running LLVM's static destructors while compile threads
    // may still be inside LLVM; everything the worker writes is flushed frame by frame.
    unsafe { libc::_exit(status) }
}
