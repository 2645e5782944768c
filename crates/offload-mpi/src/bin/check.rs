//! `offload-mpi-check`: rank 0 of a job whose other ranks are `offload-mpi-proxy`
//! (`mpirun -n 1 offload-mpi-check : -n N offload-mpi-proxy`), speaking the message format
//! directly, as no plugin would: for the first device of each proxy, copies of 0 bytes to
//! 64 MiB there and back, checked byte for byte; refused requests (an address outside every
//! allocation, a range past one, a device, program or kernel the proxy does not have, an
//! unknown queue), each an error reply naming the problem; an error of queued work reported
//! by the queue's synchronisation; corrupted messages, after which the proxy still answers;
//! then a shutdown (the job ends only if every proxy did). Prints a line per check and ends with status 0 only if every check held.
//!
//! `--stall-read`: asks the first proxy for a read stream and then takes none of its chunks,
//! making no MPI call for three timeouts; the proxy, which sends such a stream from device
//! memory, is to end (the job with it) rather than leave that memory to MPI.

use offload_mpi::client::Client;
use offload_mpi::wire::{Reply, Request};
use std::time::{Duration, Instant};

fn main() {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Serialized) else {
        eprintln!("offload-mpi-check: MPI could not be initialised (start it under mpirun)");
        std::process::exit(2);
    };
    let stall = std::env::args().any(|a| a == "--stall-read");
    let result = offload_mpi::timeout_secs()
        .and_then(|s| Client::connect(universe.world(), Duration::from_secs(u64::from(s))))
        .and_then(|c| if stall { stall_read(&c) } else { check(&c) });
    match result {
        Ok(n) => println!("mpi-check: ok, {n} proxies"),
        Err(e) => {
            println!("mpi-check: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// A byte pattern that differs for every size and offset.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed) as u8)
        .collect()
}

fn fail(what: String) -> offload_core::Error {
    offload_core::Error::InvalidArgument(what)
}

fn alloc(c: &Client, rank: i32, bytes: u64) -> offload_core::Result<u64> {
    match c.request(
        rank,
        &Request::Alloc {
            device: 0,
            bytes,
            kind: 0,
        },
    )? {
        Reply::Value { value } => Ok(value),
        other => Err(fail(format!(
            "rank {rank}: alloc answered {}",
            other.name()
        ))),
    }
}

/// Streams (copies of 256 KiB and more, in chunks) past the end of an allocation, each way:
/// refused naming the range, and the stream stays in step, so that streams inside it then
/// move their bytes exactly (on a host device the proxy receives into and sends from device
/// memory directly, which must check the range as a copy does).
fn streams(c: &Client, r: i32) -> offload_core::Result<()> {
    let len = (1usize << 20) + 5;
    let chunk = offload_mpi::wire::chunk_for(len) as u64;
    let base = alloc(c, r, len as u64)?;
    let data = pattern(len, 77);
    let write = |dst: u64, bytes: &[u8]| {
        let request = Request::WriteStream {
            device: 0,
            dst,
            len: bytes.len() as u64,
            chunk,
        };
        c.write_stream(r, &request, bytes)
    };
    let read = |src: u64, into: &mut [u8]| {
        let request = Request::ReadStream {
            device: 0,
            src,
            len: into.len() as u64,
            chunk,
        };
        c.read_stream(r, &request, into)
    };
    let want = "not inside any live allocation";
    match write(base + 3, &data) {
        Err(e) if e.to_string().contains(want) => {
            println!("mpi-check: rank {r} refuses a write stream past an allocation: {e}")
        }
        other => {
            return Err(fail(format!(
                "rank {r}: a write stream past an allocation gave {other:?}"
            )));
        }
    }
    let mut back = vec![0u8; len];
    match read(base + 3, &mut back) {
        Err(e) if e.to_string().contains(want) => {
            println!("mpi-check: rank {r} refuses a read stream past an allocation: {e}")
        }
        other => {
            return Err(fail(format!(
                "rank {r}: a read stream past an allocation gave {other:?}"
            )));
        }
    }
    write(base, &data)?;
    read(base, &mut back)?;
    if back != data {
        return Err(fail(format!(
            "rank {r}: a {len}-byte stream did not come back as written"
        )));
    }
    // An offset inside the allocation, both ways.
    let part = &data[..len - 9];
    write(base + 9, part)?;
    let mut back = vec![0u8; len - 9];
    read(base + 9, &mut back)?;
    if back != part {
        return Err(fail(format!(
            "rank {r}: a stream at offset 9 did not come back as written"
        )));
    }
    c.request(
        r,
        &Request::Free {
            device: 0,
            ptr: base,
        },
    )?;
    println!("mpi-check: rank {r} streams of {len} bytes there and back, refused past the end: ok");
    Ok(())
}

/// `--stall-read` (see the module docs).
fn stall_read(c: &Client) -> offload_core::Result<usize> {
    let r = c.proxies()[0].rank;
    let len = 4u64 << 20;
    let src = alloc(c, r, len)?;
    let request = Request::ReadStream {
        device: 0,
        src,
        len,
        chunk: offload_mpi::wire::chunk_for(len as usize) as u64,
    };
    c.post(r, &request)?;
    println!("mpi-check: rank {r} asked for a read stream; taking none of it");
    let timeout = offload_mpi::timeout_secs()?;
    std::thread::sleep(Duration::from_secs(3 * u64::from(timeout)));
    Err(fail(format!(
        "rank {r} was still in the job after three timeouts of a read stream nobody took"
    )))
}

fn check(c: &Client) -> offload_core::Result<usize> {
    let proxies = c.proxies().to_vec();
    for p in &proxies {
        let r = p.rank;
        for d in &p.devices {
            println!(
                "mpi-check: {} {} ({}, {} MiB)",
                d.address(r),
                d.info.name,
                d.info.compute_unit_kind,
                d.info.total_memory >> 20
            );
        }
        if p.devices.is_empty() {
            return Err(fail(format!("rank {r} serves no device")));
        }
        for len in [0usize, 1, 7, 4096, (1 << 20) + 3, 64 << 20] {
            let size = len.max(1) + 16;
            let base = alloc(c, r, size as u64)?;
            let data = pattern(len, len as u64);
            let t = Instant::now();
            c.request(
                r,
                &Request::Write {
                    device: 0,
                    dst: base + 16,
                    queue: None,
                    bytes: data.clone(),
                },
            )?;
            let back = c.request(
                r,
                &Request::Read {
                    device: 0,
                    src: base + 16,
                    len: len as u64,
                    queue: None,
                },
            )?;
            let took = t.elapsed();
            if back != (Reply::Bytes { bytes: data }) {
                return Err(fail(format!(
                    "rank {r}: {len} bytes did not come back as written"
                )));
            }
            c.request(
                r,
                &Request::Free {
                    device: 0,
                    ptr: base,
                },
            )?;
            println!("mpi-check: rank {r} copy {len} bytes there and back: ok ({took:?})");
        }
        // Refusals: each an error reply naming the problem, and the proxy serves on.
        let base = alloc(c, r, 64)?;
        let refusals = [
            (
                Request::Read {
                    device: 0,
                    src: base + 60,
                    len: 8,
                    queue: None,
                },
                "not inside any live allocation",
            ),
            (
                Request::Write {
                    device: 0,
                    dst: u64::MAX - 4,
                    queue: None,
                    bytes: vec![1],
                },
                "not inside any live allocation",
            ),
            (
                Request::Free {
                    device: 0,
                    ptr: base + 1000,
                },
                "not the start of a live allocation",
            ),
            (
                Request::Alloc {
                    device: 99,
                    bytes: 8,
                    kind: 0,
                },
                "device 99: this proxy has",
            ),
            (
                Request::Kernel {
                    device: 0,
                    program: 12345,
                    name: "k".into(),
                },
                "was never issued",
            ),
            (
                Request::QueueSync {
                    device: 0,
                    queue: 777,
                },
                "was never issued",
            ),
        ];
        for (request, want) in refusals {
            match c.request(r, &request) {
                Err(e) if e.to_string().contains(want) => {
                    println!("mpi-check: rank {r} refuses {}: {e}", request.name())
                }
                other => {
                    return Err(fail(format!(
                        "rank {r}: {request:?} gave {other:?}, not an error with '{want}'"
                    )));
                }
            }
        }
        streams(c, r)?;
        // Queued work that fails is not answered; its queue's synchronisation reports it.
        let Reply::Value { value: queue } = c.request(r, &Request::QueueCreate { device: 0 })?
        else {
            return Err(fail(format!("rank {r}: queue create gave no queue")));
        };
        c.request(
            r,
            &Request::Write {
                device: 0,
                dst: base + 60,
                queue: Some(queue),
                bytes: vec![0; 8],
            },
        )?;
        match c.request(r, &Request::QueueSync { device: 0, queue }) {
            Err(e) => println!("mpi-check: rank {r} reports queued work's error at sync: {e}"),
            Ok(_) => {
                return Err(fail(format!(
                    "rank {r}: a queued write past an allocation synchronised without error"
                )));
            }
        }
        c.request(r, &Request::QueueSync { device: 0, queue })?;
        c.request(r, &Request::QueueDestroy { device: 0, queue })?;
        // Corrupted messages: an error reply each, then a well-formed request still works.
        let good = Request::Read {
            device: 0,
            src: base,
            len: 64,
            queue: None,
        }
        .encode(9);
        let mut broken = vec![b"OFM".to_vec(), good[..good.len() - 5].to_vec()];
        let mut flipped = good.clone();
        flipped[6] ^= 0x40; // the kind
        broken.push(flipped);
        for b in broken {
            c.send_raw(r, b, "a corrupted message")?;
            match c.wait_for(r, None, "a corrupted message") {
                Ok(Reply::Failed { message, .. }) => {
                    println!("mpi-check: rank {r} refuses a corrupted message: {message}")
                }
                other => {
                    return Err(fail(format!(
                        "rank {r}: a corrupted message gave {other:?}"
                    )));
                }
            }
        }
        let Reply::Bytes { bytes } = c.request(
            r,
            &Request::Read {
                device: 0,
                src: base,
                len: 64,
                queue: None,
            },
        )?
        else {
            return Err(fail(format!("rank {r}: read answered without bytes")));
        };
        if bytes.len() != 64 {
            return Err(fail(format!("rank {r}: read gave {} bytes", bytes.len())));
        }
        c.request(
            r,
            &Request::Free {
                device: 0,
                ptr: base,
            },
        )?;
        c.shutdown(r);
        println!("mpi-check: rank {r} shut down");
    }
    Ok(proxies.len())
}
