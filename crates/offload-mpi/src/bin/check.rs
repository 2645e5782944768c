//! `offload-mpi-check`: rank 0 of a job whose other ranks are `offload-mpi-proxy`
//! (`mpirun -n 1 offload-mpi-check : -n N offload-mpi-proxy`). For the first device of each
//! proxy: allocations, copies of 0 bytes to 64 MiB there and back, checked byte for byte;
//! refused requests (an unknown handle, a range past an allocation, a device it does not have);
//! corrupted messages, after which the proxy still answers; then a shutdown. Prints a line per
//! check and ends with status 0 only if every check held.

use offload_mpi::client::Client;
use offload_mpi::wire::{Reply, Request};
use std::time::{Duration, Instant};

fn main() {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
        eprintln!("offload-mpi-check: MPI could not be initialised (start it under mpirun)");
        std::process::exit(2);
    };
    let timeout = std::env::var("OFFLOAD_MPI_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs);
    let result = Client::connect(universe.world(), timeout).and_then(|mut c| check(&mut c));
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

fn check(c: &mut Client) -> offload_core::Result<usize> {
    let proxies = c.proxies().to_vec();
    for p in &proxies {
        let r = p.rank;
        for (i, d) in p.devices.iter().enumerate() {
            println!(
                "mpi-check: rank {r} device {i}: {}:{} {} ({}, {} MiB)",
                d.plugin,
                d.index,
                d.name,
                d.compute_unit_kind,
                d.total_memory >> 20
            );
        }
        if p.devices.is_empty() {
            return Err(fail(format!("rank {r} serves no device")));
        }
        for len in [0usize, 1, 7, 4096, (1 << 20) + 3, 64 << 20] {
            let size = len.max(1) + 16;
            let Reply::Handle { handle } = c.request(
                r,
                &Request::Alloc {
                    device: 0,
                    bytes: size as u64,
                },
            )?
            else {
                return Err(fail(format!("rank {r}: alloc answered without a handle")));
            };
            let data = pattern(len, len as u64);
            let t = Instant::now();
            c.request(
                r,
                &Request::Write {
                    handle,
                    offset: 16,
                    bytes: data.clone(),
                },
            )?;
            let back = c.request(
                r,
                &Request::Read {
                    handle,
                    offset: 16,
                    len: len as u64,
                },
            )?;
            let took = t.elapsed();
            if back != (Reply::Bytes { bytes: data }) {
                return Err(fail(format!(
                    "rank {r}: {len} bytes did not come back as written"
                )));
            }
            c.request(r, &Request::Free { handle })?;
            println!("mpi-check: rank {r} copy {len} bytes there and back: ok ({took:?})");
        }
        // Refusals: each an error reply naming the problem, and the proxy serves on.
        let Reply::Handle { handle } = c.request(
            r,
            &Request::Alloc {
                device: 0,
                bytes: 64,
            },
        )?
        else {
            return Err(fail(format!("rank {r}: alloc answered without a handle")));
        };
        let refusals = [
            (
                Request::Read {
                    handle,
                    offset: 60,
                    len: 8,
                },
                "outside allocation",
            ),
            (
                Request::Write {
                    handle,
                    offset: u64::MAX,
                    bytes: vec![1],
                },
                "outside allocation",
            ),
            (
                Request::Free {
                    handle: handle + 1000,
                },
                "no allocation of this proxy",
            ),
            (
                Request::Alloc {
                    device: 99,
                    bytes: 8,
                },
                "device 99: this proxy has",
            ),
        ];
        for (request, want) in refusals {
            match c.request(r, &request) {
                Err(e) if e.to_string().contains(want) => {
                    println!("mpi-check: rank {r} refuses {}: {e}", request.name())
                }
                other => {
                    return Err(fail(format!(
                        "rank {r}: {request:?} gave {other:?}, not '{want}'"
                    )));
                }
            }
        }
        // Corrupted messages: an error reply each, then a well-formed request still works.
        let good = Request::Read {
            handle,
            offset: 0,
            len: 64,
        }
        .encode(9);
        let mut broken = vec![b"OFM".to_vec(), good[..good.len() - 5].to_vec()];
        let mut flipped = good.clone();
        flipped[6] ^= 0x40; // the kind
        broken.push(flipped);
        for b in &broken {
            c.send_raw(r, b);
            let reply = c.wait_reply(r, "a corrupted message")?;
            match Reply::decode(&reply) {
                Ok((0, Reply::Failed { message, .. })) => {
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
                handle,
                offset: 0,
                len: 64,
            },
        )?
        else {
            return Err(fail(format!("rank {r}: read answered without bytes")));
        };
        if bytes.len() != 64 {
            return Err(fail(format!("rank {r}: read gave {} bytes", bytes.len())));
        }
        c.request(r, &Request::Free { handle })?;
        c.request(r, &Request::Shutdown)?;
        println!("mpi-check: rank {r} shut down");
    }
    Ok(proxies.len())
}
