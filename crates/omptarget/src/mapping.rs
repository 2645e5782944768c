//! The mapping table of one OpenMP device and LLVM 19's algorithm on it (the reference's §3,
//! from `offload/src/OpenMP/Mapping.cpp` and `omptarget.cpp`): host ranges mapped to device
//! memory with a dynamic and a hold reference count, shadow pointers for attached pointers,
//! and the begin / end / update passes over a construct's map entries.
//!
//! Device memory is reached through [`DeviceMemory`], so the algorithm is tested against a
//! model (`tests` below) as well as through real programs.

use crate::abi::map;
use crate::messages;
use std::collections::{BTreeMap, HashMap};

/// An infinite reference count (globals, `omp_target_associate_ptr`).
pub const INF: u64 = u64::MAX;

/// A mark on the work that last copied into an entry: a construct on another queue that uses
/// the entry waits for it first (upstream's per-entry events).
pub type Fence = std::sync::Arc<offload::Event>;

/// What the mapping needs of a device. A construct's work may be asynchronous (a `nowait`
/// construct on a GPU, [`crate::nowait`]): then copies are queued, frees and the restoring of
/// host pointers wait until the queue has run, and entries carry fences.
pub trait DeviceMemory {
    /// `size` bytes of device memory (`size > 0`) for the host memory at `host` (0: none).
    fn alloc(&self, size: u64, host: usize) -> Option<u64>;
    /// Frees what [`DeviceMemory::alloc`] gave.
    fn free(&self, ptr: u64);
    /// Copies `size` bytes from host address `src` to device address `dst` (the program's
    /// memory: it stays as it is until the construct is over).
    fn submit(&self, dst: u64, src: usize, size: u64) -> bool;
    /// Copies `size` bytes from device address `src` to host address `dst`.
    fn retrieve(&self, dst: usize, src: u64, size: u64) -> bool;
    /// Copies a pointer value to device address `dst` (the value is this call's own: queued
    /// work copies it from storage that lives as long as the work).
    fn submit_value(&self, dst: u64, value: u64) -> bool {
        let bytes = value.to_le_bytes();
        self.submit(dst, bytes.as_ptr() as usize, 8)
    }
    /// Writes `value` to the host pointer at `addr` once the copies before it have landed.
    fn restore(&self, addr: usize, value: usize) {
        // SAFETY: the mapping passes only its shadow pointers' host addresses.
        unsafe { restore_host_pointer(addr, value) };
    }
    /// A fence after the copies so far, where they are queued; `None` when they are done.
    fn fence(&self) -> Option<Fence> {
        None
    }
    /// Orders this construct's later work after `fence`; false (and a message) if the work
    /// the fence follows failed.
    fn after(&self, fence: &Fence) -> bool {
        let _ = fence;
        true
    }
}

/// Puts back the host value of an attached pointer.
///
/// # Safety
/// `addr` is a shadow pointer's host address: a pointer the program mapped (`PTR_AND_OBJ`).
pub unsafe fn restore_host_pointer(addr: usize, value: usize) {
    // SAFETY: the caller's contract.
    unsafe { *(addr as *mut usize) = value };
}

/// An attached pointer: the host pointer at `host_addr` held `host_val`; its device copy at
/// `tgt_addr` was made to hold `tgt_val`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shadow {
    pub host_val: usize,
    pub tgt_addr: u64,
    pub tgt_val: u64,
}

/// One mapped host range.
#[derive(Debug, Clone)]
pub struct Entry {
    pub hst_base: usize,
    pub hst_begin: usize,
    pub hst_end: usize,
    /// What was allocated (the start of the padding).
    pub tgt_alloc: u64,
    /// The device address of `hst_begin`.
    pub tgt_begin: u64,
    pub dyn_ref: u64,
    pub hold_ref: u64,
    /// The variable's name (`A[0:64]`), for messages.
    pub name: String,
    /// Its declaration (`A[0:64] at info.c:27:5`), for the mapping-table dump.
    pub decl: String,
    /// Shadow pointers by host address.
    pub shadows: BTreeMap<usize, Shadow>,
    /// Whether deleting the entry frees `tgt_alloc` (false for associated pointers and globals).
    pub owned: bool,
    /// The queued copy into it that other constructs wait for ([`DeviceMemory::fence`]).
    pub fence: Option<Fence>,
    /// Queued work that uses it (kernels, copies back): its memory is not freed before they
    /// have run. Finished ones are dropped as new ones come.
    pub users: Vec<Fence>,
}

impl Entry {
    /// Adds queued work that uses the entry, dropping the finished ones.
    fn add_user(&mut self, fence: &Fence) {
        self.users.retain(|u| !matches!(u.is_complete(), Ok(true)));
        self.users.push(fence.clone());
    }

    fn total(&self) -> u64 {
        if self.dyn_ref == INF || self.hold_ref == INF {
            INF
        } else {
            self.dyn_ref + self.hold_ref
        }
    }

    fn count(&mut self, hold: bool) -> &mut u64 {
        if hold {
            &mut self.hold_ref
        } else {
            &mut self.dyn_ref
        }
    }

    fn inc(&mut self, hold: bool) {
        let c = self.count(hold);
        if *c != INF {
            *c += 1;
        }
    }

    fn dec(&mut self, hold: bool) {
        let c = self.count(hold);
        if *c != INF && *c > 0 {
            *c -= 1;
        }
    }

    fn reset(&mut self, hold: bool) {
        let c = self.count(hold);
        if *c != INF {
            *c = 1;
        }
    }

    /// `decShouldRemove`: whether this decrement ends the mapping.
    fn dec_should_remove(&self, hold: bool, after_reset: bool) -> bool {
        let (this, other) = if hold {
            (self.hold_ref, self.dyn_ref)
        } else {
            (self.dyn_ref, self.hold_ref)
        };
        if other > 0 {
            return false;
        }
        if after_reset { this != INF } else { this == 1 }
    }

    /// The device address of host address `hp` (which may lie before the entry, for an
    /// implicit extension: the offset wraps as upstream's pointer arithmetic does).
    fn tgt_of(&self, hp: usize) -> u64 {
        self.tgt_begin
            .wrapping_add((hp as u64).wrapping_sub(self.hst_begin as u64))
    }
}

/// Where a host range stands against the table.
#[derive(Debug, Clone, Copy, Default)]
struct Lookup {
    /// The entry found (its `hst_begin`).
    key: Option<usize>,
    contained: bool,
    extends_before: bool,
    extends_after: bool,
}

/// What a begin-side lookup gave (`TargetPointerResultTy`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetPointer {
    /// The device address (`None`: failure, or nothing mapped for a zero-size section).
    pub tgt: Option<u64>,
    pub is_new: bool,
    pub is_present: bool,
    pub is_host: bool,
    pub is_last: bool,
    /// The entry's key, when there is one.
    pub key: Option<usize>,
}

/// Options of [`Table::get_target_pointer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BeginFlags {
    pub to: bool,
    pub always: bool,
    pub implicit: bool,
    pub update_ref: bool,
    pub close: bool,
    pub present: bool,
    pub hold: bool,
}

/// One device's mappings.
#[derive(Debug, Default)]
pub struct Table {
    pub entries: BTreeMap<usize, Entry>,
    /// `requires unified_shared_memory`: unmapped host memory is used in place.
    pub usm: bool,
}

impl Table {
    fn lookup(&self, hp: usize, size: usize) -> Lookup {
        let mut r = Lookup::default();
        // U = first entry with begin > hp; L = the one before it.
        let upper = self.entries.range(hp + 1..).next();
        let lower = self.entries.range(..=hp).next_back();
        if size == 0 {
            if let Some((&k, e)) = lower
                && (hp < e.hst_end || hp < e.hst_base)
            {
                r.key = Some(k);
                r.contained = true;
            } else if let Some((&k, e)) = upper
                && hp >= e.hst_base
            {
                r.key = Some(k);
                r.contained = true;
            }
            return r;
        }
        let end = hp.saturating_add(size);
        if let Some((&k, e)) = lower {
            let contained = e.hst_begin <= hp && hp < e.hst_end && end <= e.hst_end;
            let after = hp < e.hst_end && end > e.hst_end;
            if contained || after {
                r.key = Some(k);
                r.contained = contained;
                r.extends_after = after;
                return r;
            }
        }
        if let Some((&k, e)) = upper {
            let before = hp < e.hst_begin && end > e.hst_begin;
            let after = hp < e.hst_end && end > e.hst_end;
            if before || after {
                r.key = Some(k);
                r.extends_before = before;
                r.extends_after = after;
            }
        }
        r
    }

    /// `getTargetPointer`: finds or makes the mapping of `[begin, begin + size)`.
    #[expect(
        clippy::too_many_arguments,
        reason = "upstream's getTargetPointer takes these"
    )]
    pub fn get_target_pointer(
        &mut self,
        dev: &dyn DeviceMemory,
        begin: usize,
        base: usize,
        padding: usize,
        size: usize,
        (name, decl): (&str, &str),
        f: BeginFlags,
    ) -> TargetPointer {
        let l = self.lookup(begin, size);
        let mut r = TargetPointer {
            is_present: true,
            ..Default::default()
        };
        if let Some(k) = l.key
            && (l.contained || ((l.extends_before || l.extends_after) && f.implicit))
        {
            let e = self.entries.get_mut(&k).expect("looked up");
            if let Some(fence) = &e.fence
                && !dev.after(fence)
            {
                r.tgt = None;
                return r;
            }
            let action = if f.update_ref {
                e.inc(f.hold);
                r.is_new = false;
                " (incremented)"
            } else {
                r.is_new = e.total() == 1;
                " (update suppressed)"
            };
            r.tgt = Some(e.tgt_of(begin));
            r.key = Some(k);
            messages::info_mapping_exists(
                f.implicit,
                (begin, e.tgt_of(begin), size),
                e,
                (action, f.hold),
                Some(name),
            );
        } else if let Some(k) = l.key
            && (l.extends_before || l.extends_after)
        {
            let e = &self.entries[&k];
            messages::message(&format!(
                "explicit extension not allowed: host address specified is {:#x} ({size} bytes), \
                 but device allocation maps to host at {:#x} ({} bytes)",
                begin,
                e.hst_begin,
                e.hst_end - e.hst_begin
            ));
            if f.present {
                messages::message(&format!(
                    "device mapping required by 'present' map type modifier does not exist for \
                     host address {begin:#x} ({size} bytes)"
                ));
            }
            r.tgt = None;
        } else if self.usm && !f.close {
            if size > 0 {
                messages::info_line(messages::info::MAPPING_CHANGED, || {
                    format!(
                        "Return HstPtrBegin {begin:#018x} Size={size} for unified shared memory"
                    )
                });
                r.is_present = false;
                r.is_host = true;
                r.tgt = Some(begin as u64);
            } else {
                r.is_present = false;
            }
        } else if f.present {
            messages::message(&format!(
                "device mapping required by 'present' map type modifier does not exist for host \
                 address {begin:#x} ({size} bytes)"
            ));
            r.tgt = None;
        } else if size > 0 {
            match dev.alloc((padding + size) as u64, begin) {
                Some(alloc) => {
                    let tgt = alloc + padding as u64;
                    let (dyn_ref, hold_ref) = if f.hold { (0, 1) } else { (1, 0) };
                    let e = Entry {
                        hst_base: base,
                        hst_begin: begin,
                        hst_end: begin + size,
                        tgt_alloc: alloc,
                        tgt_begin: tgt,
                        dyn_ref,
                        hold_ref,
                        name: name.to_string(),
                        decl: decl.to_string(),
                        shadows: BTreeMap::new(),
                        owned: true,
                        fence: None,
                        users: Vec::new(),
                    };
                    messages::info_mapping_created(&e);
                    tracing::info!(target: "offload::memory",
                        "OpenMP map entry: host {:#x}..{:#x} ({size} bytes, {}) -> device {tgt:#x}",
                        begin, begin + size, messages::shown(name));
                    self.entries.insert(begin, e);
                    r.is_new = true;
                    r.tgt = Some(tgt);
                    r.key = Some(begin);
                }
                None => r.tgt = None,
            }
        } else {
            r.is_present = false;
            r.tgt = None;
        }
        if let Some(tgt) = r.tgt
            && !r.is_host
            && f.to
            && (r.is_new || f.always)
            && size != 0
        {
            // Upstream names a copy after the entry it serves.
            let shown = r
                .key
                .and_then(|k| self.entries.get(&k))
                .map_or(name, |e| &e.name);
            messages::info_copy_to_device(begin, tgt, size, shown);
            if !dev.submit(tgt, begin, size as u64) {
                r.tgt = None;
            } else if let Some(e) = r.key.and_then(|k| self.entries.get_mut(&k)) {
                e.fence = dev.fence();
            }
        }
        r
    }

    /// `getTgtPtrBegin`: the mapping of `[hp, hp + size)` on the way out (or for an update).
    pub fn get_tgt_ptr_begin(
        &mut self,
        hp: usize,
        size: usize,
        update_ref: bool,
        hold: bool,
        must_contain: bool,
        force_delete: bool,
    ) -> TargetPointer {
        let l = self.lookup(hp, size);
        let mut r = TargetPointer::default();
        if let Some(k) = l.key
            && (l.contained || (!must_contain && (l.extends_before || l.extends_after)))
        {
            let e = self.entries.get_mut(&k).expect("looked up");
            r.is_last = e.dec_should_remove(hold, force_delete);
            if force_delete {
                e.reset(hold);
            }
            if update_ref {
                e.dec(hold);
            }
            r.tgt = Some(e.tgt_of(hp));
            r.is_present = true;
            r.key = Some(k);
            let action = match (update_ref, r.is_last, force_delete) {
                (false, _, _) => " (update suppressed)",
                (true, true, true) => " (reset, delayed deletion)",
                (true, true, false) => " (decremented, delayed deletion)",
                (true, false, _) => " (decremented)",
            };
            messages::info_mapping_exists(false, (hp, e.tgt_of(hp), size), e, (action, hold), None);
        } else if self.usm {
            r.is_host = true;
            r.tgt = Some(hp as u64);
        } else {
            r.tgt = Some(hp as u64);
        }
        r
    }

    /// Removes the entry at `key` if nothing holds it any more; frees its memory if it owns it.
    /// `size`: the map entry's, for the info line (upstream prints that, not the entry's).
    pub fn remove_if_unused(&mut self, dev: &dyn DeviceMemory, key: usize, size: usize) -> bool {
        let Some(e) = self.entries.get(&key) else {
            return false;
        };
        if e.total() != 0 {
            return false;
        }
        let e = self.entries.remove(&key).expect("present");
        // Its memory goes back once the copy into it and the queued work that uses it have run
        // (a failure there is that construct's to report; the memory is free either way).
        for fence in e.fence.iter().chain(&e.users) {
            dev.after(fence);
        }
        messages::info_mapping_removed(&e, size);
        tracing::info!(target: "offload::memory",
            "OpenMP map entry removed: host {:#x}..{:#x} ({})",
            e.hst_begin, e.hst_end, messages::shown(&e.name));
        if e.owned {
            dev.free(e.tgt_alloc);
        }
        true
    }

    /// The device address of host address `hp` (one byte), without changing any count.
    pub fn translate(&self, hp: usize) -> Option<u64> {
        let l = self.lookup(hp, 1);
        let k = l.key.filter(|_| l.contained)?;
        Some(self.entries[&k].tgt_of(hp))
    }
}

/// One map entry of a construct, as the compiler passes it.
#[derive(Debug, Clone)]
pub struct MapArg {
    pub base: usize,
    pub begin: usize,
    pub size: i64,
    pub ty: i64,
    pub name: String,
    /// `name at file:line:col`.
    pub decl: String,
    /// A user-defined mapper function (0: none).
    pub mapper: usize,
}

/// Expands an entry with a mapper into the mapper's components.
pub type Expand<'a> = &'a dyn Fn(&MapArg) -> Vec<MapArg>;

/// Why a pass failed (the message was printed already).
#[derive(Debug)]
pub struct Failed;

fn padding_for(args: &[MapArg], i: usize) -> usize {
    let a = &args[i];
    if map::member_of(a.ty).is_some() {
        return 0;
    }
    match args.get(i + 1) {
        Some(next) if map::member_of(next.ty) == Some(i) => {
            let align = if a.base == 0 {
                16
            } else {
                (1usize << a.base.trailing_zeros()).min(16)
            };
            a.begin % align
        }
        _ => 0,
    }
}

/// `targetDataBegin` over `args` (mappers already expanded). `bases` receives RETURN_PARAM
/// translations.
pub fn data_begin(
    table: &mut Table,
    dev: &dyn DeviceMemory,
    args: &[MapArg],
    bases: &mut [usize],
    from_mapper: bool,
    expand: Expand<'_>,
) -> Result<(), Failed> {
    for i in 0..args.len() {
        let a = &args[i];
        let t = a.ty;
        if t & (map::LITERAL | map::PRIVATE) != 0 {
            continue;
        }
        if a.mapper != 0 {
            let components = expand(a);
            let mut b: Vec<usize> = components.iter().map(|c| c.base).collect();
            data_begin(table, dev, &components, &mut b, true, expand)?;
            continue;
        }
        let padding = padding_for(args, i);
        let flags = BeginFlags {
            to: t & map::TO != 0,
            always: t & map::ALWAYS != 0,
            implicit: t & map::IMPLICIT != 0,
            update_ref: map::member_of(t).is_none() && !(from_mapper && i == 0),
            close: t & map::CLOSE != 0,
            present: t & map::PRESENT != 0,
            hold: t & map::OMPX_HOLD != 0,
        };
        let mut base = a.base;
        let mut pointer: Option<(usize, TargetPointer)> = None;
        if t & map::PTR_AND_OBJ != 0 {
            let p = table.get_target_pointer(
                dev,
                base,
                base,
                0,
                std::mem::size_of::<usize>(),
                (&a.name, &a.decl),
                BeginFlags {
                    to: false,
                    always: false,
                    ..flags
                },
            );
            if p.tgt.is_none() {
                messages::error(if flags.present {
                    "Call to getTargetPointer returned null pointer ('present' map type modifier)."
                } else {
                    "Call to getTargetPointer returned null pointer (device failure or illegal mapping)."
                });
                return Err(Failed);
            }
            pointer = Some((base, p));
            // SAFETY: the compiler passes the address of a host pointer as a PTR_AND_OBJ base.
            base = unsafe { *(base as *const usize) };
        }
        let size = a.size.max(0) as usize;
        let update_ref = if t & map::PTR_AND_OBJ != 0 {
            !from_mapper || i != 0
        } else {
            flags.update_ref
        };
        let r = table.get_target_pointer(
            dev,
            a.begin,
            base,
            padding,
            size,
            (&a.name, &a.decl),
            BeginFlags {
                update_ref,
                ..flags
            },
        );
        let Some(tgt) = r.tgt.or(if size == 0 && !flags.present {
            Some(0)
        } else {
            None
        }) else {
            messages::error(if flags.present {
                "Call to getTargetPointer returned null pointer ('present' map type modifier)."
            } else {
                "Call to getTargetPointer returned null pointer (device failure or illegal mapping)."
            });
            return Err(Failed);
        };
        if t & map::RETURN_PARAM != 0 {
            bases[i] = (tgt as usize).wrapping_sub(a.begin.wrapping_sub(base));
        }
        if t != 0 && map::member_of(t).is_none() && !flags.implicit && !r.is_present && !r.is_host {
            messages::info_line(messages::info::EMPTY_MAPPING, || {
                format!(
                    "variable {} does not have a valid device counterpart",
                    if a.name.is_empty() {
                        "unknown"
                    } else {
                        &a.name
                    }
                )
            });
        }
        if let Some((host_ptr_addr, p)) = pointer
            && !r.is_host
            && r.tgt.is_some()
        {
            let expected = tgt.wrapping_sub(a.begin.wrapping_sub(base) as u64);
            let ptgt = p.tgt.expect("checked");
            if let Some(key) = p.key {
                let e = table.entries.get_mut(&key).expect("just mapped");
                let s = Shadow {
                    host_val: base,
                    tgt_addr: ptgt,
                    tgt_val: expected,
                };
                let changed = e.shadows.get(&host_ptr_addr) != Some(&s);
                if changed {
                    e.shadows.insert(host_ptr_addr, s);
                    // Named after the pointer's entry, as upstream's submitData does.
                    messages::info_copy_to_device(host_ptr_addr, ptgt, 8, &e.name);
                    if !dev.submit_value(ptgt, expected) {
                        messages::error("Copying data to device failed.");
                        return Err(Failed);
                    }
                    e.fence = dev.fence();
                }
            }
        }
    }
    Ok(())
}

/// What `targetDataEnd` does to an entry once every copy is done: (key, delete it, restore
/// its shadow pointers, the map entry's size).
type Post = (usize, bool, bool, usize);

/// `targetDataEnd` over `args`, in reverse order. Entries are removed after every copy,
/// those of a mapper's components (their own pass) before the construct's own, as upstream's
/// post-processing runs.
pub fn data_end(
    table: &mut Table,
    dev: &dyn DeviceMemory,
    args: &[MapArg],
    from_mapper: bool,
    expand: Expand<'_>,
) -> Result<(), Failed> {
    let mut lists = Vec::new();
    // A failed pass stops there, its post-processing undone, as upstream's.
    data_end_pass(table, dev, args, from_mapper, expand, &mut lists)?;
    let all: Vec<Post> = if lists.len() == 1 {
        lists.pop().expect("one")
    } else {
        lists.into_iter().flatten().collect()
    };
    // Queued work (this construct's kernel and copies back) uses these entries until it has
    // run: whoever deletes one waits for it.
    if !all.is_empty()
        && let Some(fence) = dev.fence()
    {
        for p in &all {
            if let Some(e) = table.entries.get_mut(&p.0) {
                e.add_user(&fence);
            }
        }
    }
    // Upstream counts the construct's references to an entry (its data-end thread count); the
    // last one deletes it, and the info line gives that map entry's size. Few entries: a scan.
    let mut left: HashMap<usize, usize> = HashMap::new();
    if all.len() > 16 {
        for p in &all {
            *left.entry(p.0).or_default() += 1;
        }
    }
    for (i, &(key, delete, from, size)) in all.iter().enumerate() {
        let last = if all.len() > 16 {
            let n = left.get_mut(&key).expect("counted");
            *n -= 1;
            *n == 0
        } else {
            !all[i + 1..].iter().any(|p| p.0 == key)
        };
        if from && let Some(e) = table.entries.get(&key) {
            for (&addr, s) in &e.shadows {
                dev.restore(addr, s.host_val);
            }
        }
        if delete && last {
            table.remove_if_unused(dev, key, size);
        }
    }
    Ok(())
}

fn data_end_pass(
    table: &mut Table,
    dev: &dyn DeviceMemory,
    args: &[MapArg],
    from_mapper: bool,
    expand: Expand<'_>,
    lists: &mut Vec<Vec<Post>>,
) -> Result<(), Failed> {
    let mut post: Vec<Post> = Vec::new();
    for i in (0..args.len()).rev() {
        let a = &args[i];
        let t = a.ty;
        if t & (map::LITERAL | map::PRIVATE) != 0 {
            continue;
        }
        if a.mapper != 0 {
            data_end_pass(table, dev, &expand(a), true, expand, lists)?;
            continue;
        }
        let member = map::member_of(t).is_some();
        let update_ref = (!member || t & map::PTR_AND_OBJ != 0) && !(from_mapper && i == 0);
        let hold = t & map::OMPX_HOLD != 0;
        let size = a.size.max(0) as usize;
        let r = table.get_tgt_ptr_begin(
            a.begin,
            size,
            update_ref,
            hold,
            t & map::IMPLICIT == 0,
            t & map::DELETE != 0,
        );
        if !r.is_present && !r.is_host && (size != 0 || t & map::PRESENT != 0) {
            if t & map::PRESENT != 0 {
                messages::message(&format!(
                    "device mapping required by 'present' map type modifier does not exist for \
                     host address {:#x} ({size} bytes)",
                    a.begin
                ));
                return Err(Failed);
            }
            continue;
        }
        if !r.is_present {
            continue;
        }
        let key = r.key.expect("present entries have a key");
        let from = t & map::FROM != 0;
        if from && (t & map::ALWAYS != 0 || r.is_last) && !r.is_host && size != 0 {
            let tgt = r.tgt.expect("present");
            messages::info_copy_to_host(tgt, a.begin, size, &table.entries[&key].name);
            if !dev.retrieve(a.begin, tgt, size as u64) {
                messages::error("Copying data from device failed.");
                return Err(Failed);
            }
        }
        // Members without PTR_AND_OBJ are never deleted on their own.
        let delete = !(r.is_host || (member && t & map::PTR_AND_OBJ == 0));
        post.push((key, delete, from, size));
    }
    lists.push(post);
    Ok(())
}

/// `targetDataUpdate` of one contiguous piece.
pub fn update_piece(
    table: &mut Table,
    dev: &dyn DeviceMemory,
    hp: usize,
    size: usize,
    ty: i64,
) -> Result<(), Failed> {
    let r = table.get_tgt_ptr_begin(hp, size, false, false, true, false);
    if !r.is_present {
        if ty & map::PRESENT != 0 {
            messages::message(&format!(
                "device mapping required by 'present' motion modifier does not exist for host \
                 address {hp:#x} ({size} bytes)"
            ));
            return Err(Failed);
        }
        return Ok(());
    }
    if r.is_host {
        return Ok(());
    }
    let tgt = r.tgt.expect("present");
    let key = r.key.expect("present");
    if let Some(fence) = &table.entries[&key].fence
        && !dev.after(fence)
    {
        return Err(Failed);
    }
    if ty & map::TO != 0 {
        messages::info_copy_to_device(hp, tgt, size, &table.entries[&key].name);
        if !dev.submit(tgt, hp, size as u64) {
            return Err(Failed);
        }
        let shadows: Vec<Shadow> = table.entries[&key].shadows.values().copied().collect();
        for s in shadows {
            if !dev.submit_value(s.tgt_addr, s.tgt_val) {
                return Err(Failed);
            }
        }
        let fence = dev.fence();
        let e = table.entries.get_mut(&key).expect("present");
        if let Some(f) = &fence {
            e.add_user(f);
        }
        e.fence = fence;
    }
    if ty & map::FROM != 0 {
        messages::info_copy_to_host(tgt, hp, size, &table.entries[&key].name);
        if !dev.retrieve(hp, tgt, size as u64) {
            return Err(Failed);
        }
        for (&addr, s) in &table.entries[&key].shadows {
            dev.restore(addr, s.host_val);
        }
        if let Some(fence) = dev.fence() {
            table
                .entries
                .get_mut(&key)
                .expect("present")
                .add_user(&fence);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Device memory that is host memory, with counts of what was done.
    #[derive(Default)]
    struct Model {
        live: RefCell<BTreeMap<u64, Vec<u8>>>,
        submits: RefCell<u32>,
        retrieves: RefCell<u32>,
    }

    impl DeviceMemory for Model {
        fn alloc(&self, size: u64, _host: usize) -> Option<u64> {
            let v = vec![0u8; size as usize];
            let p = v.as_ptr() as u64;
            self.live.borrow_mut().insert(p, v);
            Some(p)
        }
        fn free(&self, ptr: u64) {
            assert!(self.live.borrow_mut().remove(&ptr).is_some(), "double free");
        }
        fn submit(&self, dst: u64, src: usize, size: u64) -> bool {
            *self.submits.borrow_mut() += 1;
            // SAFETY: test buffers of at least `size` bytes.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size as usize) };
            true
        }
        fn retrieve(&self, dst: usize, src: u64, size: u64) -> bool {
            *self.retrieves.borrow_mut() += 1;
            // SAFETY: as above.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size as usize) };
            true
        }
    }

    fn arg(v: &[i32], ty: i64) -> MapArg {
        MapArg {
            base: v.as_ptr() as usize,
            begin: v.as_ptr() as usize,
            size: std::mem::size_of_val(v) as i64,
            ty,
            name: "v".into(),
            decl: "v at unknown:0:0".into(),
            mapper: 0,
        }
    }

    fn none(_: &MapArg) -> Vec<MapArg> {
        Vec::new()
    }

    /// A seeded model of the reference counts: random nests of begin/end with TO, FROM,
    /// ALWAYS, DELETE and HOLD on a few arrays; every copy happens exactly when the model says.
    #[test]
    fn reference_counts_follow_a_model() {
        let mut seq = offload_core::rand::XorShift(0x0123_4567_89ab_cdef);
        let mut next = |n: u64| seq.next_u64() % n;
        for _round in 0..200 {
            let dev = Model::default();
            let mut table = Table::default();
            let arrays: Vec<Vec<i32>> = (0..3).map(|i| vec![i; 4]).collect();
            // model: per array (dyn, hold)
            let mut model = [(0u64, 0u64); 3];
            for _ in 0..20 {
                let k = next(3) as usize;
                let hold = next(4) == 0;
                let begin = next(2) == 0 || model[k] == (0, 0);
                let mut ty = [map::TO, map::FROM, map::TO | map::FROM, 0][next(4) as usize];
                if hold {
                    ty |= map::OMPX_HOLD;
                }
                let (s0, r0) = (*dev.submits.borrow(), *dev.retrieves.borrow());
                let a = arg(&arrays[k], ty);
                if begin {
                    let always = next(3) == 0;
                    let ty = if always { ty | map::ALWAYS } else { ty };
                    let a = MapArg { ty, ..a };
                    data_begin(&mut table, &dev, &[a], &mut [0], false, &none).unwrap();
                    let was_new = model[k] == (0, 0);
                    if hold {
                        model[k].1 += 1
                    } else {
                        model[k].0 += 1
                    }
                    let copies = (ty & map::TO != 0 && (was_new || always)) as u32;
                    assert_eq!(*dev.submits.borrow() - s0, copies, "begin {ty:#x} on {k}");
                } else {
                    let delete = next(5) == 0;
                    let ty = if delete { ty | map::DELETE } else { ty };
                    let a = MapArg { ty, ..a };
                    data_end(&mut table, &dev, &[a], false, &none).unwrap();
                    let (d, h) = &mut model[k];
                    let mapped = *d + *h > 0;
                    let (this, other) = if hold { (*h, *d) } else { (*d, *h) };
                    let last = mapped && other == 0 && if delete { true } else { this == 1 };
                    if mapped {
                        let c = if hold { h } else { d };
                        if delete {
                            *c = 0;
                        } else if *c > 0 {
                            *c -= 1;
                        }
                    }
                    let copies = (ty & map::FROM != 0 && last) as u32;
                    assert_eq!(*dev.retrieves.borrow() - r0, copies, "end {ty:#x} on {k}");
                }
                for (i, a) in arrays.iter().enumerate() {
                    let e = table.entries.get(&(a.as_ptr() as usize));
                    let want = model[i];
                    match e {
                        Some(e) => assert_eq!((e.dyn_ref, e.hold_ref), want, "array {i}"),
                        None => assert_eq!(want, (0, 0), "array {i}"),
                    }
                }
            }
            // Memory of removed entries was freed; the rest is still live.
            assert_eq!(dev.live.borrow().len(), table.entries.len());
        }
    }

    #[test]
    fn sections_inside_a_mapping_translate_and_extensions_are_refused() {
        let dev = Model::default();
        let mut t = Table::default();
        let v = vec![0i32; 16];
        let b = v.as_ptr() as usize;
        data_begin(&mut t, &dev, &[arg(&v, map::TO)], &mut [0], false, &none).unwrap();
        let inner = t.get_target_pointer(&dev, b + 8, b, 0, 8, ("v", "v"), BeginFlags::default());
        assert_eq!(inner.tgt, Some(t.entries[&b].tgt_begin + 8));
        // Explicit extension past the end: refused.
        let ext = t.get_target_pointer(&dev, b + 60, b, 0, 8, ("v", "v"), BeginFlags::default());
        assert!(ext.tgt.is_none());
        // Implicit: allowed.
        let imp = t.get_target_pointer(
            &dev,
            b + 60,
            b,
            0,
            8,
            ("v", "v"),
            BeginFlags {
                implicit: true,
                ..Default::default()
            },
        );
        assert!(imp.tgt.is_some());
        // PRESENT on something unmapped fails.
        let w = [0i32; 4];
        let e = data_begin(
            &mut t,
            &dev,
            &[arg(&w, map::TO | map::PRESENT)],
            &mut [0],
            false,
            &none,
        );
        assert!(e.is_err());
    }
}
