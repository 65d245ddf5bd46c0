//! Struct offsets of the running kernel, read from its BTF at load time.
//!
//! Rust eBPF programs get no CO-RE relocations, so the agent resolves every
//! field the programs read here and hands them over as [`KernelOffsets`].
//! Nothing here is a constant for one kernel: the two layouts of the per-mm
//! RSS counters (an array of `percpu_counter` since 6.2, `struct mm_rss_stat`
//! before) are both recognised by their BTF shape.

use std::{
    ops::Deref,
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
};

use agent_common::KernelOffsets;
use btf_rs::{Btf, Type};
use fallible_iterator::FallibleIterator as _;

/// Where the running kernel publishes its BTF.
pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub(crate) enum BtfError {
    #[error("cannot read kernel BTF from {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: btf_rs::Error,
    },
    #[error("kernel BTF has no {kind} named `{name}`")]
    MissingType { kind: &'static str, name: String },
    #[error("kernel BTF: `{owner}` has no member `{member}`")]
    MissingMember { owner: String, member: String },
    #[error("kernel BTF: enum `{owner}` has no value `{name}`")]
    MissingEnumValue { owner: String, name: String },
    #[error("kernel BTF: `{what}` has an unexpected shape ({detail})")]
    Shape { what: String, detail: String },
    #[error("kernel BTF is malformed: {0}")]
    Malformed(#[from] btf_rs::Error),
}

/// Parsed copies of a kernel's BTF made by this process, and alive now.
static PARSED_MADE: AtomicUsize = AtomicUsize::new(0);
static PARSED_ALIVE: AtomicUsize = AtomicUsize::new(0);

/// A parsed kernel BTF (several MiB of heap): start-up data, used to
/// resolve offsets and attach, then dropped. Counted while alive, so a test
/// can tell that nothing kept one after attach ([`parsed`]).
#[derive(Debug)]
pub(crate) struct Parsed<T>(T);

impl<T> Parsed<T> {
    pub(crate) fn new(parsed: T) -> Self {
        PARSED_MADE.fetch_add(1, Ordering::Relaxed);
        PARSED_ALIVE.fetch_add(1, Ordering::Relaxed);
        Self(parsed)
    }
}

impl<T> Deref for Parsed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Drop for Parsed<T> {
    fn drop(&mut self) {
        PARSED_ALIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Parsed kernel BTFs ([`Parsed`]) of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedBtf {
    /// Made since the process started.
    pub made: usize,
    /// Alive now.
    pub alive: usize,
}

/// How many parsed kernel BTFs were made, and how many are alive now.
pub fn parsed() -> ParsedBtf {
    ParsedBtf {
        made: PARSED_MADE.load(Ordering::Relaxed),
        alive: PARSED_ALIVE.load(Ordering::Relaxed),
    }
}

/// Loads the kernel's BTF from `path` (normally [`VMLINUX_BTF`]).
pub(crate) fn load(path: &Path) -> Result<Parsed<Btf>, BtfError> {
    Btf::from_file(path)
        .map(Parsed::new)
        .map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })
}

/// Resolves every offset the eBPF programs need.
pub(crate) fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let rss = rss_layout(btf)?;
    let [mm_filepages, mm_anonpages, mm_shmempages] = mm_counter_indices(btf)?;
    Ok(KernelOffsets {
        task_pid: member_offset(btf, "task_struct", "pid")?,
        task_tgid: member_offset(btf, "task_struct", "tgid")?,
        task_comm: member_offset(btf, "task_struct", "comm")?,
        task_mm: member_offset(btf, "task_struct", "mm")?,
        task_cgroups: member_offset(btf, "task_struct", "cgroups")?,
        css_set_subsys: member_offset(btf, "css_set", "subsys")?,
        css_cgroup: member_offset(btf, "cgroup_subsys_state", "cgroup")?,
        cgroup_kn: member_offset(btf, "cgroup", "kn")?,
        cgroup_level: member_offset(btf, "cgroup", "level")?,
        kernfs_node_id: member_offset(btf, "kernfs_node", "id")?,
        mm_total_vm: member_offset(btf, "mm_struct", "total_vm")?,
        mm_rss_base: rss.base,
        mm_rss_stride: rss.stride,
        mm_rss_value: rss.value,
        memory_cgrp_id: enum_value(btf, "cgroup_subsys_id", "memory_cgrp_id")?,
        mm_filepages,
        mm_anonpages,
        mm_shmempages,
        valid: 1,
        // Filled by `growth_offsets` when the kernel has what the growth
        // program reads; left 0 (program not attached) otherwise.
        mm_owner: 0,
        css_parent: 0,
        memcg_usage: 0,
    })
}

/// Offsets the growth program (`sched_stat_runtime`) needs on top of the others:
/// `mm->owner` (CONFIG_MEMCG), the css parent, and the memory cgroup's
/// `page_counter` usage.
pub(crate) fn growth_offsets(btf: &Btf, offsets: &mut KernelOffsets) -> Result<(), BtfError> {
    let usage = member_offset(btf, "page_counter", "usage")?;
    offsets.mm_owner = member_offset(btf, "mm_struct", "owner")?;
    offsets.css_parent = member_offset(btf, "cgroup_subsys_state", "parent")?;
    offsets.memcg_usage = member_offset(btf, "mem_cgroup", "memory")? + usage;
    Ok(())
}

/// Whether the kernel's `mark_victim` tracepoint passes the victim's
/// `task_struct *` (Linux 6.2 and later) rather than only its pid.
pub(crate) fn mark_victim_passes_task(btf: &Btf) -> Result<bool, BtfError> {
    // The tracepoint's prototype is the typedef `btf_trace_mark_victim`, a
    // pointer to `void (void *, <args>...)`.
    let Some(Type::Typedef(td)) = types_named(btf, "btf_trace_mark_victim")?
        .into_iter()
        .find(|t| matches!(t, Type::Typedef(_)))
    else {
        return Err(BtfError::MissingType {
            kind: "typedef",
            name: "btf_trace_mark_victim".into(),
        });
    };
    let proto = match strip(btf, btf.resolve_chained_type(&td)?)? {
        Type::Ptr(p) => btf.resolve_chained_type(&p)?,
        other => other,
    };
    let Type::FuncProto(proto) = proto else {
        return Err(shape("btf_trace_mark_victim", "not a function pointer"));
    };
    let Some(first_arg) = proto.parameters.get(1) else {
        return Err(shape("btf_trace_mark_victim", "no tracepoint argument"));
    };
    Ok(matches!(
        strip(btf, btf.resolve_chained_type(first_arg)?)?,
        Type::Ptr(_)
    ))
}

struct RssLayout {
    base: u32,
    stride: u32,
    value: u32,
}

/// `mm_struct::rss_stat` is `struct percpu_counter rss_stat[NR_MM_COUNTERS]`
/// since 6.2 (value: `percpu_counter::count`), and `struct mm_rss_stat {
/// atomic_long_t count[NR_MM_COUNTERS]; }` before.
fn rss_layout(btf: &Btf) -> Result<RssLayout, BtfError> {
    let (base, ty) = member(btf, "mm_struct", "rss_stat")?;
    match strip(btf, ty)? {
        Type::Array(array) => {
            let elem = strip(btf, btf.resolve_chained_type(&array)?)?;
            let Type::Struct(counter) = &elem else {
                return Err(shape("mm_struct.rss_stat[]", "element is not a struct"));
            };
            let (value, _) = find_member(btf, counter, "count")?
                .ok_or_else(|| missing_member("percpu_counter", "count"))?;
            Ok(RssLayout {
                base,
                stride: to_u32(counter.size()),
                value,
            })
        }
        Type::Struct(stat) => {
            let (count, count_ty) = find_member(btf, &stat, "count")?
                .ok_or_else(|| missing_member("mm_rss_stat", "count"))?;
            let Type::Array(array) = strip(btf, count_ty)? else {
                return Err(shape("mm_rss_stat.count", "not an array"));
            };
            let stride = type_size(btf, btf.resolve_chained_type(&array)?)?;
            Ok(RssLayout {
                base: base + count,
                stride,
                value: 0,
            })
        }
        other => Err(shape("mm_struct.rss_stat", other.name())),
    }
}

/// Byte offset of `owner.name`, looking through anonymous structs and unions.
pub(crate) fn member_offset(btf: &Btf, owner: &str, name: &str) -> Result<u32, BtfError> {
    member(btf, owner, name).map(|(offset, _)| offset)
}

fn member(btf: &Btf, owner: &str, name: &str) -> Result<(u32, Type), BtfError> {
    let strukt = named_struct(btf, owner)?;
    find_member(btf, &strukt, name)?.ok_or_else(|| missing_member(owner, name))
}

/// Depth-first through anonymous members; returns the byte offset and type.
fn find_member(
    btf: &Btf,
    strukt: &btf_rs::Struct,
    name: &str,
) -> Result<Option<(u32, Type)>, BtfError> {
    for m in &strukt.members {
        let member_name = btf.resolve_name(m).unwrap_or_default();
        let ty = btf.resolve_chained_type(m)?;
        if member_name == name {
            if m.bitfield_size().is_some_and(|bits| bits != 0) || m.bit_offset() % 8 != 0 {
                return Err(shape(name, "a bitfield"));
            }
            return Ok(Some((m.bit_offset() / 8, ty)));
        }
        if member_name.is_empty()
            && let Type::Struct(inner) | Type::Union(inner) = strip(btf, ty)?
            && let Some((offset, ty)) = find_member(btf, &inner, name)?
        {
            return Ok(Some((m.bit_offset() / 8 + offset, ty)));
        }
    }
    Ok(None)
}

/// The value of enumerator `name` in the named enum `owner`.
fn enum_value(btf: &Btf, owner: &str, name: &str) -> Result<u32, BtfError> {
    types_named(btf, owner)?
        .iter()
        .find_map(|ty| enumerator(btf, ty, name))
        .ok_or_else(|| BtfError::MissingEnumValue {
            owner: owner.into(),
            name: name.into(),
        })
}

/// The `MM_*` RSS counter indices, from the anonymous enum that declares
/// them (one pass over every type).
fn mm_counter_indices(btf: &Btf) -> Result<[u32; 3], BtfError> {
    const NAMES: [&str; 3] = ["MM_FILEPAGES", "MM_ANONPAGES", "MM_SHMEMPAGES"];
    let mut types = btf.type_iter();
    while let Some(ty) = types.next()? {
        if let [Some(file), Some(anon), Some(shmem)] = NAMES.map(|n| enumerator(btf, &ty, n)) {
            return Ok([file, anon, shmem]);
        }
    }
    Err(BtfError::MissingEnumValue {
        owner: "<anonymous enum>".into(),
        name: NAMES.join(", "),
    })
}

fn enumerator(btf: &Btf, ty: &Type, name: &str) -> Option<u32> {
    let Type::Enum(e) = ty else { return None };
    e.members
        .iter()
        .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == name))
        .map(|m| m.val())
}

fn named_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct, BtfError> {
    types_named(btf, name)?
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
        .ok_or_else(|| BtfError::MissingType {
            kind: "struct",
            name: name.into(),
        })
}

fn types_named(btf: &Btf, name: &str) -> Result<Vec<Type>, BtfError> {
    btf.resolve_types_by_name(name)
        .map_err(|_| BtfError::MissingType {
            kind: "type",
            name: name.into(),
        })
}

/// Follows typedefs and qualifiers to the underlying type.
fn strip(btf: &Btf, mut ty: Type) -> Result<Type, BtfError> {
    loop {
        ty = match ty {
            Type::Typedef(t) => btf.resolve_chained_type(&t)?,
            Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(&t)?
            }
            Type::TypeTag(t) => btf.resolve_chained_type(&t)?,
            other => return Ok(other),
        }
    }
}

fn type_size(btf: &Btf, ty: Type) -> Result<u32, BtfError> {
    match strip(btf, ty)? {
        Type::Int(i) => Ok(to_u32(i.size())),
        Type::Struct(s) | Type::Union(s) => Ok(to_u32(s.size())),
        Type::Ptr(_) => Ok(8),
        other => Err(shape("RSS counter", other.name())),
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn missing_member(owner: &str, member: &str) -> BtfError {
    BtfError::MissingMember {
        owner: owner.into(),
        member: member.into(),
    }
}

fn shape(what: &str, detail: &str) -> BtfError {
    BtfError::Shape {
        what: what.into(),
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the machine's own BTF; kernels without it skip (there is nothing
    /// to check), which the doctor reports separately.
    fn host_btf() -> Option<Parsed<Btf>> {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            eprintln!("skipped: {VMLINUX_BTF} is absent on this kernel");
            return None;
        }
        Some(load(path).expect("host BTF parses"))
    }

    #[test]
    fn resolves_offsets_on_this_kernel() {
        let Some(btf) = host_btf() else { return };
        let off = kernel_offsets(&btf).expect("offsets");
        assert_eq!(off.valid, 1);
        // Offsets differ per kernel, but some relations hold on every one.
        assert_ne!(off.task_pid, off.task_tgid);
        assert_eq!(
            off.task_tgid,
            off.task_pid + 4,
            "tgid follows pid in task_struct"
        );
        assert!(off.mm_rss_stride >= 8);
        let ids = [off.mm_filepages, off.mm_anonpages, off.mm_shmempages];
        assert_eq!(
            ids.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
        assert!(
            off.memory_cgrp_id < 16,
            "memory controller index {}",
            off.memory_cgrp_id
        );
    }

    #[test]
    fn missing_member_is_named() {
        let Some(btf) = host_btf() else { return };
        let err = member_offset(&btf, "task_struct", "no_such_field").unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernel BTF: `task_struct` has no member `no_such_field`"
        );
    }
}
