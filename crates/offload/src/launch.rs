//! The launch builder: `kernel.launch(dims).arg(n).arg(&x).arg(&mut y).run()?`.
//!
//! Arguments borrow their buffers for as long as the launch needs them: while the `Launch`
//! lives, and, for a launch [`Launch::on`] a [`crate::QueueScope`], until the scope ends.
//! [`Launch::run`] checks every argument against the kernel's `OFFLOAD_PARAMS` record (see
//! `offload_kernel.h`) before anything runs: the count, each scalar's type, each pointer's
//! element type, that the kernel writes only through mutable borrows (on a queue, shared ones
//! too: the queue orders the work), and that each buffer is
//! at least as long as the extent the record declares for these arguments (`float y[n]`).
//! A [`Launch::unchecked`] launch is the way to launch a kernel without a record, or with raw
//! arguments.

use crate::Kernel;
use crate::buffer::{BufferView, BufferViewMut, DeviceBuffer, DeviceCopy, HostBuffer, element_of};
use crate::params::{CType, KernelParams, Param, ParamKind, Pointer};
use crate::{Queue, QueueScope};
use offload_core::{Error, KernelArg, LaunchDims, Result};
use std::marker::PhantomData;

/// Arguments stored inline: kernels with more take a heap block.
const INLINE: usize = 6;

/// What the check knows about one argument.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum ArgSource {
    /// A scalar of this C type.
    Scalar(CType),
    /// Elements of a buffer or view.
    Buffer {
        /// Number of `T`s.
        len: usize,
        /// What `T` is (one static per type keeps the argument small: it is moved with each
        /// argument added).
        meta: &'static BufferMeta,
        /// Borrowed mutably.
        writable: bool,
        /// Memory no kernel may write, on a queue either: a [`crate::HostBuffer`] borrowed
        /// shared (a host reference may see it) or a program's global.
        host_shared: bool,
        /// Which device object it belongs to.
        device: usize,
    },
    /// A raw [`KernelArg`] ([`Launch::arg_raw`]).
    Raw,
}

/// The element type of a buffer argument.
#[doc(hidden)]
#[derive(Debug)]
pub struct BufferMeta {
    /// [`crate::buffer::element_of`].
    element: Option<(CType, usize)>,
    /// `std::any::type_name::<T>`, called only for messages.
    type_name: fn() -> &'static str,
}

/// A kernel's `OFFLOAD_PARAMS` record compiled for the fast check ([`passes`]): one rule per
/// parameter, made once when the kernel is looked up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rule {
    /// A 32- or 64-bit scalar of exactly this type.
    Scalar(CType),
    /// A pointer to elements of `elem` with a known extent.
    Pointer {
        elem: CType,
        writable: bool,
        need: Need,
    },
    /// A parameter the fast check lets no argument through for: [`explain`] says why.
    Refuse,
}

/// A pointer parameter's extent, for [`Rule::Pointer`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Need {
    /// `[n]`: the value of this parameter.
    Param(usize),
    /// `[64]`.
    Literal(u64),
    /// Anything else: the record's extent, evaluated.
    Expr,
}

/// The rules of a record.
pub(crate) fn rules(params: &KernelParams) -> Box<[Rule]> {
    params
        .params
        .iter()
        .map(|p| match &p.kind {
            ParamKind::Scalar(t) if matches!(t.size(), 4 | 8) => Rule::Scalar(*t),
            ParamKind::Pointer(Pointer {
                elem: Some(elem),
                writable,
                extent: Some(e),
                ..
            }) => Rule::Pointer {
                elem: *elem,
                writable: *writable,
                need: match (e.as_param(), e.as_literal()) {
                    (Some(i), _) => Need::Param(i),
                    (_, Some(v)) => Need::Literal(v),
                    _ => Need::Expr,
                },
            },
            _ => Rule::Refuse,
        })
        .collect()
}

/// A value a launch can take as an argument: `i32`, `u32`, `i64`, `u64`, `f32`, `f64`, a
/// buffer (`&buf` where the kernel only reads, `&mut buf` where it writes) or a view
/// ([`DeviceBuffer::slice`], [`DeviceBuffer::slice_mut`]). Sealed.
pub trait KernelArgument<'a>: sealed::Sealed {
    #[doc(hidden)]
    fn to_arg(&self) -> (KernelArg, ArgSource);
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalar_argument {
    ($($t:ty => $variant:ident, $c:ident);*) => { $(
        impl sealed::Sealed for $t {}
        impl KernelArgument<'_> for $t {
            fn to_arg(&self) -> (KernelArg, ArgSource) {
                (KernelArg::$variant(*self), ArgSource::Scalar(CType::$c))
            }
        }
    )* };
}
scalar_argument!(i32 => I32, I32; u32 => U32, U32; i64 => I64, I64; u64 => U64, U64;
    f32 => F32, F32; f64 => F64, F64);

fn buffer_arg<T: DeviceCopy>(v: BufferView<'_, T>, writable: bool) -> (KernelArg, ArgSource) {
    (
        KernelArg::Ptr(v.ptr()),
        ArgSource::Buffer {
            len: v.len(),
            meta: const {
                &BufferMeta {
                    element: element_of::<T>(),
                    type_name: std::any::type_name::<T>,
                }
            },
            writable,
            host_shared: v.device_writes_refused(),
            device: v.device_identity(),
        },
    )
}

impl<T: DeviceCopy> sealed::Sealed for &DeviceBuffer<T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for &'a DeviceBuffer<T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(self.view(), false)
    }
}
impl<T: DeviceCopy> sealed::Sealed for &mut DeviceBuffer<T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for &'a mut DeviceBuffer<T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(self.view(), true)
    }
}
impl<T: DeviceCopy> sealed::Sealed for &HostBuffer<T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for &'a HostBuffer<T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(self.view(), false)
    }
}
impl<T: DeviceCopy> sealed::Sealed for &mut HostBuffer<T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for &'a mut HostBuffer<T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(self.view().exclusive(), true)
    }
}
impl<T: DeviceCopy> sealed::Sealed for BufferView<'_, T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for BufferView<'a, T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(*self, false)
    }
}
impl<T: DeviceCopy> sealed::Sealed for BufferViewMut<'_, T> {}
impl<'a, T: DeviceCopy> KernelArgument<'a> for BufferViewMut<'a, T> {
    fn to_arg(&self) -> (KernelArg, ArgSource) {
        buffer_arg(self.exclusive_view(), true)
    }
}

/// Where [`Launch::on`] enqueues: a [`Queue`] (the launch keeps its buffers alive until it
/// has run; their borrows end at the call) or a [`QueueScope`] (the buffers stay borrowed
/// until the scope's end, so they cannot be dropped or moved while the launch may run). `'a`
/// is the borrow of the launch's buffers, `'q` how long the launch keeps the queue.
pub trait LaunchQueue<'a, 'q>: sealed::Sealed {
    #[doc(hidden)]
    fn queue(self) -> &'q Queue;
}
impl sealed::Sealed for &Queue {}
impl<'q> LaunchQueue<'_, 'q> for &'q Queue {
    fn queue(self) -> &'q Queue {
        self
    }
}
impl sealed::Sealed for &QueueScope<'_, '_> {}
impl<'a: 's, 's: 'q, 'q> LaunchQueue<'a, 'q> for &'s QueueScope<'s, '_> {
    fn queue(self) -> &'q Queue {
        QueueScope::queue(self)
    }
}

/// A launch being put together ([`Kernel::launch`], [`crate::TypedKernel::launch`]): the one
/// way to launch a kernel. Add the arguments ([`Launch::arg`]), say where it runs
/// ([`Launch::on`] a queue; synchronously otherwise), and [`Launch::run`] it; nothing runs
/// before. [`Launch::unchecked`] is the same launch without the parameter check, whose
/// `run` is `unsafe`: for kernels without a record
/// and for front ends that pass raw arguments. Built in place (`&mut self` methods, as
/// `std::process::Command` is): `'a` is the borrow of every buffer added and `'k` that of the
/// kernel and the queue, for as long as the launch lives.
#[must_use = "a launch does nothing until it is run"]
pub struct Launch<'k, 'a> {
    kernel: &'k Kernel,
    dims: LaunchDims,
    queue: Option<&'k Queue>,
    len: usize,
    args: [KernelArg; INLINE],
    sources: [ArgSource; INLINE],
    /// All the arguments, once there are more than `INLINE`.
    spill: (Vec<KernelArg>, Vec<ArgSource>),
    /// Invariant in `'a`: a launch put on a scope ([`Launch::on`]) keeps the scope's rule
    /// (every buffer borrowed until the scope ends) for the buffers added later too, also
    /// when it is moved into a variable of a shorter lifetime.
    _borrows: PhantomData<fn(&'a ()) -> &'a ()>,
}

impl std::fmt::Debug for Launch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "launch of {:?}, {}, {} argument(s){}",
            self.kernel,
            self.dims,
            self.len,
            if self.queue.is_some() {
                ", on a queue"
            } else {
                ""
            }
        )
    }
}

impl Kernel {
    /// Starts a launch with these dimensions: add the arguments in order with
    /// [`Launch::arg`], then run it.
    #[inline(always)]
    pub fn launch<'k, 'a>(&'k self, dims: LaunchDims) -> Launch<'k, 'a> {
        Launch {
            kernel: self,
            dims,
            queue: None,
            len: 0,
            args: [KernelArg::I32(0); INLINE],
            sources: [ArgSource::Raw; INLINE],
            spill: (Vec::new(), Vec::new()),
            _borrows: PhantomData,
        }
    }
}

impl<'k, 'a> Launch<'k, 'a> {
    #[inline(always)]
    fn push(&mut self, arg: KernelArg, source: ArgSource) -> &mut Self {
        if self.len < INLINE {
            self.args[self.len] = arg;
            self.sources[self.len] = source;
        } else {
            self.spill_push(arg, source);
        }
        self.len += 1;
        self
    }

    #[cold]
    fn spill_push(&mut self, arg: KernelArg, source: ArgSource) {
        if self.len == INLINE {
            self.spill = (self.args.to_vec(), self.sources.to_vec());
        }
        self.spill.0.push(arg);
        self.spill.1.push(source);
    }

    /// The next argument: a scalar, or a buffer or view borrowed for as long as the launch
    /// lives (`&buf` where the kernel only reads, `&mut buf` or [`DeviceBuffer::slice_mut`]
    /// where it writes).
    #[inline(always)]
    pub fn arg<A: KernelArgument<'a>>(&mut self, arg: A) -> &mut Self {
        let (a, source) = arg.to_arg();
        self.push(a, source)
    }

    /// The next argument as a raw [`KernelArg`]: a scalar is checked like any other; a raw
    /// pointer has no extent, so only a [`Launch::unchecked`] launch takes one for a pointer
    /// parameter.
    #[inline]
    pub fn arg_raw(&mut self, arg: KernelArg) -> &mut Self {
        self.push(arg, ArgSource::Raw)
    }

    /// The next arguments, raw ([`Launch::arg_raw`] for each): what a front end that made
    /// the argument list itself passes.
    #[inline]
    pub fn args_raw(&mut self, args: &[KernelArg]) -> &mut Self {
        for a in args {
            self.push(*a, ArgSource::Raw);
        }
        self
    }

    /// Runs it on `queue` (a [`Queue`] or a [`QueueScope`], of the kernel's device) instead of
    /// synchronously: it runs after the queue's earlier work, and a synchronous operation on
    /// one of its buffers waits for it. A buffer the kernel writes may be borrowed shared here
    /// (`&y`), so that the same scope can also copy it back: the queue orders its own work;
    /// work on other queues that uses the same buffer must be ordered with events.
    #[inline]
    pub fn on<Q: LaunchQueue<'a, 'k>>(&mut self, queue: Q) -> &mut Self {
        self.queue = Some(queue.queue());
        self
    }

    /// This launch without the parameter check: the way to launch a kernel without an
    /// `OFFLOAD_PARAMS` record, or with raw pointer arguments ([`Launch::arg_raw`]).
    /// [`Unchecked::run`] is `unsafe`; buffers of another device are still refused.
    #[inline]
    pub fn unchecked(&mut self) -> Unchecked<'_, 'k, 'a> {
        Unchecked(self)
    }

    #[inline(always)]
    fn args(&self) -> (&[KernelArg], &[ArgSource]) {
        if self.len <= INLINE {
            (&self.args[..self.len], &self.sources[..self.len])
        } else {
            (&self.spill.0, &self.spill.1)
        }
    }

    /// Launches it: checks the arguments against the kernel's `OFFLOAD_PARAMS` record, then
    /// runs the kernel and returns when it has run, or enqueues it ([`Launch::on`]). Refused,
    /// with the parameter named, when the kernel has no record or an argument does not match
    /// it (see the module docs). The launch keeps its arguments: running it again launches
    /// the kernel again.
    #[inline]
    pub fn run(&mut self) -> Result<()> {
        // One copy per queue kind, its check and queue known when it is compiled.
        // SAFETY: checked against the kernel's parameter record (`submit`'s contract).
        unsafe {
            match self.queue {
                None => self.submit(true, None),
                Some(q) => self.submit(true, Some(q)),
            }
        }
    }

    /// The launch, with the parameter check (`checked`), else with the device check of every
    /// buffer only; on `queue`, if any (the launch's).
    ///
    /// # Safety
    /// Unchecked, [`Unchecked::run`]'s contract. Checked, none beyond trusting the image:
    /// the check against the kernel's parameter record (its count and types, and that every
    /// buffer holds the extent the record declares for these arguments, borrowed as the record
    /// says it is used) is what makes the device's launch contract hold, if the record is true
    /// (and it is the image's, which the program's load trusted). A queue keeps the borrowed
    /// buffers alive until it has run (`LaunchQueue`).
    #[inline(always)]
    unsafe fn submit(&self, checked: bool, queue: Option<&Queue>) -> Result<()> {
        let (args, sources) = self.args();
        if checked {
            check(self.kernel, args, sources, queue.is_some())?;
        } else {
            check_devices(self.kernel, sources)?;
        }
        let program = &self.kernel.program;
        if let Some(q) = queue {
            program.check_queue(q)?;
        }
        // SAFETY: this function's contract.
        unsafe { program.launch(self.kernel, &self.dims, args, queue.map(Queue::handle)) }
    }
}

/// A [`Launch`] without the parameter check ([`Launch::unchecked`]).
#[must_use = "an unchecked launch does nothing until it is run"]
#[derive(Debug)]
pub struct Unchecked<'l, 'k, 'a>(&'l mut Launch<'k, 'a>);

impl Unchecked<'_, '_, '_> {
    /// Launches it as [`Launch::run`] does, without checking the arguments against the
    /// kernel's record.
    ///
    /// # Safety
    /// What is still checked: the launch shape, that each buffer belongs to the kernel's
    /// device (and the queue to it too), and what the backend checks (on the host: pointers
    /// into live allocations, and the argument types where the image has an
    /// `OFFLOAD_SIGNATURE`). What is not: the number and types of the arguments (on other
    /// backends), and how far the kernel reads or writes from each pointer. The caller must
    /// make sure the arguments are the kernel's parameters, every buffer or raw pointer
    /// reaches as far as the kernel touches for these arguments, and, as [`crate::raw`] says,
    /// raw device memory the kernel uses stays allocated until the launch has run and is
    /// nobody else's meanwhile.
    #[inline]
    pub unsafe fn run(self) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            match self.0.queue {
                None => self.0.submit(false, None),
                Some(q) => self.0.submit(false, Some(q)),
            }
        }
    }
}

fn check_devices(kernel: &Kernel, sources: &[ArgSource]) -> Result<()> {
    let device = kernel.program.device();
    for (i, s) in sources.iter().enumerate() {
        if let ArgSource::Buffer { device: d, .. } = s
            && *d != device.identity()
        {
            return Err(Error::InvalidArgument(format!(
                "kernel '{}' argument {i} is a buffer of another device than {device} (the \
                 kernel's)",
                kernel.name
            )));
        }
    }
    Ok(())
}

fn scalar_of(arg: &KernelArg) -> Option<CType> {
    Some(match arg {
        KernelArg::I32(_) => CType::I32,
        KernelArg::U32(_) => CType::U32,
        KernelArg::I64(_) => CType::I64,
        KernelArg::U64(_) => CType::U64,
        KernelArg::F32(_) => CType::F32,
        KernelArg::F64(_) => CType::F64,
        KernelArg::Ptr(_) | KernelArg::Word(_) => return None,
    })
}

fn passed(source: &ArgSource, arg: &KernelArg) -> String {
    match source {
        ArgSource::Scalar(c) => format!("a {}", c.rust_name()),
        ArgSource::Buffer {
            len,
            meta,
            writable,
            ..
        } => format!(
            "{} buffer of {len} {}",
            if *writable { "a mutable" } else { "a shared" },
            (meta.type_name)()
        ),
        ArgSource::Raw => format!("a raw {}", arg.type_name()),
    }
}

/// Whether a launch passes every rule of [`check`], decided by the kernel's compiled
/// [`Rule`]s without building anything: the path every correct launch takes. `false` sends
/// it to [`check`], which says why.
#[inline]
fn passes(kernel: &Kernel, args: &[KernelArg], sources: &[ArgSource], queued: bool) -> bool {
    let Some(rules) = kernel.rules.as_deref() else {
        return false;
    };
    if rules.len() != args.len() || sources.len() != args.len() {
        return false;
    }
    let device = kernel.program.device().identity();
    for (i, (rule, source)) in rules.iter().zip(sources).enumerate() {
        match (*rule, *source) {
            (Rule::Scalar(t), ArgSource::Scalar(c)) => {
                if c != t {
                    return false;
                }
            }
            (Rule::Scalar(t), ArgSource::Raw) => {
                if scalar_of(&args[i]) != Some(t) {
                    return false;
                }
            }
            (
                Rule::Pointer {
                    elem,
                    writable: written,
                    need,
                },
                ArgSource::Buffer {
                    len,
                    meta,
                    writable,
                    host_shared,
                    device: d,
                },
            ) => {
                let Some((rust, per)) = meta.element else {
                    return false;
                };
                if d != device
                    || !elem.accepts(rust)
                    || (written && (host_shared || (!writable && !queued)))
                {
                    return false;
                }
                let need = match need {
                    Need::Param(p) => match args.get(p).and_then(KernelArg::integer) {
                        Some(v) if v >= 0 => v as u128,
                        _ => return false,
                    },
                    Need::Literal(v) => u128::from(v),
                    Need::Expr => {
                        let Some(Ok(params)) = kernel.params() else {
                            return false;
                        };
                        let ParamKind::Pointer(Pointer {
                            extent: Some(extent),
                            ..
                        }) = &params.params[i].kind
                        else {
                            return false;
                        };
                        match extent.eval(&|p| args.get(p).and_then(KernelArg::integer)) {
                            Ok(v) => v,
                            Err(_) => return false,
                        }
                    }
                };
                if need > len as u128 * per as u128 {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

/// The checked launch's rules, against the kernel's record: the fast yes of [`passes`], else
/// the rules one by one, which name what failed. (Debug builds, the tests', check that the
/// two agree on every launch the fast path lets through.)
#[inline]
fn check(kernel: &Kernel, args: &[KernelArg], sources: &[ArgSource], queued: bool) -> Result<()> {
    if passes(kernel, args, sources, queued) {
        debug_assert!(
            explain(kernel, args, sources, queued).is_ok(),
            "the fast check let through a launch the rules refuse: {:?}",
            explain(kernel, args, sources, queued)
        );
        return Ok(());
    }
    explain(kernel, args, sources, queued)
}

/// The rules one by one, naming the first that fails.
#[cold]
#[inline(never)]
fn explain(kernel: &Kernel, args: &[KernelArg], sources: &[ArgSource], queued: bool) -> Result<()> {
    check_devices(kernel, sources)?;
    let name = &kernel.name;
    let refuse = |what: String| Err(Error::InvalidArgument(format!("kernel '{name}': {what}")));
    let params: &KernelParams = match kernel.params() {
        None => {
            return refuse(
                "its image has no OFFLOAD_PARAMS record, so the launch cannot be checked: add \
                 `OFFLOAD_PARAMS(kernel, <its parameters, pointers with extents>)` after the \
                 kernel, or launch it unchecked (Launch::unchecked, whose run is unsafe)"
                    .into(),
            );
        }
        Some(Err(e)) => return refuse(format!("its OFFLOAD_PARAMS record is unusable: {e}")),
        Some(Ok(p)) => p,
    };
    if params.params.len() != args.len() {
        return refuse(format!(
            "it takes {} argument(s) ({}); the launch passes {}",
            params.params.len(),
            params.text,
            args.len()
        ));
    }
    for (i, ((param, arg), source)) in params.params.iter().zip(args).zip(sources).enumerate() {
        // Named only when refused: the success path allocates nothing.
        let what = || param.describe(i);
        match (&param.kind, source) {
            (ParamKind::Scalar(t), ArgSource::Scalar(_) | ArgSource::Raw)
                if scalar_of(arg).is_some_and(|a| t.accepts(a)) => {}
            (ParamKind::Scalar(t), _) if matches!(t.size(), 4 | 8) => {
                return refuse(format!(
                    "{} is a {}; the launch passes {}",
                    what(),
                    t.rust_name(),
                    passed(source, arg)
                ));
            }
            (ParamKind::Scalar(t), _) => {
                return refuse(format!(
                    "{}: a {}-byte scalar, which offload does not pass (only 32- and 64-bit \
                     integers, float and double)",
                    what(),
                    t.size()
                ));
            }
            (ParamKind::Unsupported(why), _) => return refuse(format!("{}: {why}", what())),
            (ParamKind::Pointer(p), ArgSource::Buffer { .. }) => {
                check_pointer(&what, param, p, source, params, args, queued).or_else(refuse)?;
            }
            (ParamKind::Pointer(_), ArgSource::Raw) if matches!(arg, KernelArg::Ptr(_)) => {
                return refuse(format!(
                    "{} gets a raw pointer, whose extent is unknown: pass a buffer or a view, \
                     or launch it unchecked (Launch::unchecked, whose run is unsafe)",
                    what()
                ));
            }
            (ParamKind::Pointer(_), _) => {
                return refuse(format!(
                    "{} is a pointer; the launch passes {}",
                    what(),
                    passed(source, arg)
                ));
            }
        }
    }
    Ok(())
}

fn check_pointer(
    what: &dyn Fn() -> String,
    param: &Param,
    p: &Pointer,
    source: &ArgSource,
    params: &KernelParams,
    args: &[KernelArg],
    queued: bool,
) -> std::result::Result<(), String> {
    let ArgSource::Buffer {
        len,
        meta,
        writable,
        host_shared,
        ..
    } = *source
    else {
        unreachable!("called for buffers only")
    };
    let BufferMeta { element, type_name } = *meta;
    if p.writable && (host_shared || (!writable && !queued)) {
        return Err(format!(
            "{}: the kernel may write through it, and the launch passes a shared borrow of a \
             buffer of {}: pass `&mut buffer` or `buffer.slice_mut(..)` (or enqueue it, where \
             the queue orders the work)",
            what(),
            type_name()
        ));
    }
    let Some(extent) = &p.extent else {
        return Err(format!(
            "{} has no extent, so its length cannot be checked: declare it as an array \
             parameter (`{} {}[n]`) in OFFLOAD_PARAMS, or launch it unchecked \
             (Launch::unchecked, whose run is unsafe)",
            what(),
            p.elem_spelling,
            param.name.as_deref().unwrap_or("x")
        ));
    };
    let Some(elem) = p.elem else {
        return Err(format!(
            "{}: its elements are '{}', whose size offload does not know, so the extent cannot \
             be checked: launch it unchecked (Launch::unchecked, whose run is unsafe)",
            what(),
            p.elem_spelling
        ));
    };
    let count = match element {
        Some((rust, per)) if elem.accepts(rust) => len as u128 * per as u128,
        _ => {
            return Err(format!(
                "{}: its elements are {} ({} in Rust); the launch passes a buffer of {}",
                what(),
                p.elem_spelling,
                elem.rust_name(),
                type_name()
            ));
        }
    };
    let value = |i: usize| args.get(i).and_then(KernelArg::integer);
    let need = extent
        .eval(&value)
        .map_err(|e| format!("{}: {e}", what()))?;
    if need > count {
        let values: Vec<String> = extent
            .params()
            .into_iter()
            .filter_map(|i| {
                let n = params.params[i].name.as_deref()?;
                Some(format!("{n} = {}", value(i)?))
            })
            .collect();
        return Err(format!(
            "{} may touch {need} element(s) ([{}] with {}), and the buffer holds {count}",
            what(),
            extent.spelling,
            if values.is_empty() {
                "constants only".to_string()
            } else {
                values.join(", ")
            }
        ));
    }
    Ok(())
}
