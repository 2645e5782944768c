//! Launch arguments against a kernel's parameters.

use offload_core::jit::ParamType;
use offload_core::{Error, KernelArg, Result};

/// Refuses a launch whose arguments do not match the kernel's parameters: calling a function
/// with the wrong arguments is undefined behaviour, a wrong result at best.
pub fn check(name: &str, params: &[ParamType], args: &[KernelArg]) -> Result<()> {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if params.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' takes {} argument(s) ({}); the launch passes {} ({})",
            params.len(),
            list(params.iter().map(ToString::to_string).collect()),
            args.len(),
            list(args.iter().map(|a| a.type_name().to_string()).collect()),
        )));
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        let fits = matches!(
            (p, a),
            (ParamType::I32, KernelArg::I32(_) | KernelArg::U32(_))
                | (ParamType::I64, KernelArg::I64(_) | KernelArg::U64(_))
                | (ParamType::F32, KernelArg::F32(_))
                | (ParamType::F64, KernelArg::F64(_))
                | (ParamType::Ptr, KernelArg::Ptr(_))
                | (ParamType::Ptr | ParamType::I64, KernelArg::Word(_))
        );
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' argument {i} is {p} in the kernel; the launch passes {}",
                a.type_name()
            )));
        }
    }
    Ok(())
}

/// Refuses a launch whose arguments do not have the sizes a driver reports for the kernel's
/// parameters (`sizes`, in bytes): the driver reads that many bytes for each.
pub fn check_sizes(name: &str, sizes: &[usize], args: &[KernelArg]) -> Result<()> {
    if sizes.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' takes {} argument(s) (of {} bytes); the launch passes {}",
            sizes.len(),
            if sizes.is_empty() {
                "no".to_string()
            } else {
                sizes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            args.len()
        )));
    }
    for (i, (size, arg)) in sizes.iter().zip(args).enumerate() {
        if *size != arg.size() {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' argument {i} is {size} bytes in the kernel; the launch passes {} \
                 ({} bytes)",
                arg.type_name(),
                arg.size()
            )));
        }
    }
    Ok(())
}

/// Refuses a block larger than the kernel itself allows (`limit` threads, as its code was
/// compiled for: `source` names where the number comes from), with both numbers.
pub fn check_block(name: &str, block: [u32; 3], limit: u32, source: &str) -> Result<()> {
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    if threads > u64::from(limit) {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' runs at most {limit} threads per block ({source}); the launch asks \
             for {}x{}x{} = {threads}",
            block[0], block[1], block[2]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::DevicePtr;

    #[test]
    fn arguments_are_checked_against_the_kernel_signature() {
        let params = [
            ParamType::I32,
            ParamType::F32,
            ParamType::Ptr,
            ParamType::Ptr,
        ];
        let ptr = KernelArg::Ptr(DevicePtr(64));
        let good = [KernelArg::U32(1), KernelArg::F32(2.0), ptr, ptr];
        check("saxpy", &params, &good).unwrap();
        let e = check("saxpy", &params, &good[..3]).unwrap_err().to_string();
        assert!(
            e.contains(
                "takes 4 argument(s) (i32, float, ptr, ptr); the launch passes 3 (u32, f32, ptr)"
            ),
            "{e}"
        );
        let e = check(
            "saxpy",
            &params,
            &[KernelArg::I32(1), KernelArg::F64(2.0), ptr, ptr],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("argument 1 is float in the kernel; the launch passes f64"),
            "{e}"
        );
        assert!(check("k", &[ParamType::Other("i16".into())], &[KernelArg::I32(1)]).is_err());
        check("empty", &[], &[]).unwrap();
    }

    #[test]
    fn a_word_is_a_pointer_or_a_64_bit_integer_and_nothing_else() {
        let w = KernelArg::Word(0x1000);
        check("omp", &[ParamType::Ptr, ParamType::I64], &[w, w]).unwrap();
        for p in [ParamType::I32, ParamType::F32, ParamType::F64] {
            let e = check("omp", std::slice::from_ref(&p), &[w])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "argument 0 is {p} in the kernel; the launch passes word"
                )),
                "{e}"
            );
        }
    }
}

/// A kernel's work-group memory (CUDA's shared memory, AMD's LDS, Level Zero's local memory):
/// what the kernel declares itself, and its `__local` pointer parameters, whose sizes the launch
/// passes as integer arguments. The one computation of a launch's layout and budget of that
/// memory, for every backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalMemory {
    /// What the memory is called on the device (`shared memory`, `LDS`, `local memory`).
    pub name: &'static str,
    /// Bytes the kernel declares itself (static).
    pub fixed: u64,
    /// The `__local` pointer parameters: the argument's index and its region's alignment (1:
    /// none), in argument order.
    pub pointers: Vec<(usize, u64)>,
    /// The least size a `__local` argument may have (Level Zero refuses 0).
    pub min_size: i64,
}

impl LocalMemory {
    /// Where each `__local` argument's region starts (after the static part and `dynamic` bytes
    /// of the launch's dynamic shared memory, each aligned), by argument index, and the whole
    /// work-group's memory. An argument that is not a size counts 0 ([`LocalMemory::check`]
    /// refuses it).
    pub fn layout(&self, dynamic: u64, args: &[KernelArg]) -> (Vec<(usize, u64)>, u64) {
        let mut at = self.fixed.saturating_add(dynamic);
        let mut offsets = Vec::with_capacity(self.pointers.len());
        for &(i, align) in &self.pointers {
            let align = align.max(1);
            at = at.div_ceil(align).saturating_mul(align);
            offsets.push((i, at));
            let size = args.get(i).and_then(KernelArg::integer).unwrap_or(0);
            at = at.saturating_add(u64::try_from(size).unwrap_or(0));
        }
        (offsets, at)
    }

    /// Checks a launch of kernel `kernel`: each `__local` argument is a size of at least
    /// `min_size`, and the work-group's memory fits the `limit` bytes `device` has per work-group.
    pub fn check(
        &self,
        kernel: &str,
        dynamic: u64,
        args: &[KernelArg],
        limit: u64,
        device: &str,
    ) -> Result<()> {
        for &(i, _) in &self.pointers {
            let arg = args.get(i);
            let size = arg.and_then(KernelArg::integer);
            if size.is_none_or(|v| v < i128::from(self.min_size)) {
                let passed = match (arg, size) {
                    (_, Some(v)) => v.to_string(),
                    (Some(a), None) => a.type_name().to_string(),
                    (None, None) => "nothing".to_string(),
                };
                return Err(Error::InvalidArgument(format!(
                    "kernel '{kernel}' argument {i} is a `__local` pointer (a pointer to {} the \
                     launch sizes): pass its size in bytes as an integer (u32) of at least {}; \
                     the launch passes {passed}",
                    self.name, self.min_size
                )));
            }
        }
        let (_, total) = self.layout(dynamic, args);
        if total > limit {
            let arguments = total.saturating_sub(self.fixed).saturating_sub(dynamic);
            let of_arguments = if self.pointers.is_empty() {
                String::new()
            } else {
                format!(", {arguments} of its `__local` arguments")
            };
            return Err(Error::InvalidArgument(format!(
                "kernel '{kernel}' needs {total} bytes of {} per work-group ({} bytes of static \
                 {}, {dynamic} of the launch's dynamic shared memory{of_arguments}); {device} \
                 has at most {limit}",
                self.name, self.fixed, self.name
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod local_memory_tests {
    use super::*;

    #[test]
    fn local_memory_is_laid_out_aligned_after_the_static_and_dynamic_parts_and_checked() {
        let m = LocalMemory {
            name: "LDS",
            fixed: 10,
            pointers: vec![(1, 4), (3, 8)],
            min_size: 0,
        };
        let args = [
            KernelArg::I32(0),
            KernelArg::U32(6),
            KernelArg::I32(0),
            KernelArg::U32(16),
        ];
        // 10 static + 3 dynamic = 13, aligned to 16 for argument 1 (6 bytes: 22), then to 24
        // for argument 3 (16 bytes: 40).
        assert_eq!(m.layout(3, &args), (vec![(1, 16), (3, 24)], 40));
        m.check("k", 3, &args, 40, "dev").unwrap();
        let e = m.check("k", 3, &args, 39, "dev").unwrap_err().to_string();
        assert!(
            e.contains("needs 40 bytes of LDS per work-group")
                && e.contains("10 bytes of static LDS, 3 of the launch's dynamic shared memory, 27 of its `__local` arguments")
                && e.contains("dev has at most 39"),
            "{e}"
        );
        let bad = [KernelArg::I32(0), KernelArg::F32(1.0)];
        let e = m
            .check("k", 0, &bad, 1 << 16, "dev")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("argument 1 is a `__local` pointer") && e.contains("passes f32"),
            "{e}"
        );
        let strict = LocalMemory {
            min_size: 1,
            ..m.clone()
        };
        let zero = [
            KernelArg::I32(0),
            KernelArg::U32(0),
            KernelArg::I32(0),
            KernelArg::U32(4),
        ];
        let e = strict
            .check("k", 0, &zero, 1 << 16, "dev")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1; the launch passes 0"), "{e}");
        // Sizes near u64::MAX saturate instead of wrapping into a small total.
        let huge = LocalMemory {
            name: "LDS",
            fixed: u64::MAX - 1,
            pointers: vec![(0, 8)],
            min_size: 0,
        };
        assert!(
            huge.check("k", 5, &[KernelArg::U64(8)], 1 << 16, "dev")
                .is_err()
        );
    }
}
