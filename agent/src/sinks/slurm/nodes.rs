//! The Slurm controller's view of its nodes (`scontrol show node -o`), as
//! the cluster guard counts it: the nodes that share a partition with the
//! node to drain, and which of them are already on their way out, by
//! anyone's doing.

use super::{REASON_PREFIX, scontrol};
use crate::sinks::guard::Capacity;

/// Words of a node's `State` that take it out of the pool: drained or
/// draining, down, failed, in maintenance, not responding, rebooting or
/// powered off.
const GONE: [&str; 8] = [
    "DRAIN",
    "DOWN",
    "FAIL",
    "MAINT",
    "NOT_RESPONDING",
    "REBOOT",
    "POWER",
    "FUTURE",
];

/// One node as `scontrol show node -o` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub name: String,
    /// `IDLE`, `MIXED+DRAIN`, `DOWN+NOT_RESPONDING`, …
    pub state: String,
    pub reason: String,
    pub partitions: Vec<String>,
}

impl Node {
    /// Out of the pool, for any reason and by anyone.
    pub(crate) fn gone(&self) -> bool {
        // `IDLE*`: not responding, in older releases' notation.
        self.state.ends_with('*') || GONE.iter().any(|w| self.state.contains(w))
    }

    /// Drained (or draining) by memwatch, on this host or another.
    pub(crate) fn drained_by_memwatch(&self) -> bool {
        self.state.contains("DRAIN") && self.reason.starts_with(REASON_PREFIX)
    }
}

/// Every node of `scontrol show node -o` output, one per line.
pub(crate) fn parse(output: &str) -> Vec<Node> {
    output
        .lines()
        .map(scontrol::fields)
        .filter_map(|mut f| {
            Some(Node {
                name: f.remove("NodeName")?,
                state: f.remove("State").unwrap_or_default(),
                reason: f.remove("Reason").unwrap_or_default(),
                partitions: f
                    .remove("Partitions")
                    .unwrap_or_default()
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// The nodes that share a partition with `node` (itself included; just
/// itself when it is in no partition).
pub(crate) fn pool<'a>(nodes: &'a [Node], node: &Node) -> Vec<&'a Node> {
    let pool: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.name == node.name || n.partitions.iter().any(|p| node.partitions.contains(p)))
        .collect();
    pool
}

/// The pool as the guard counts it: every node of it running work.
pub(crate) fn capacity(pool: &[&Node]) -> Capacity {
    let leaving = pool.iter().filter(|n| n.gone()).count();
    Capacity {
        listed: pool.len(),
        leaving,
        running: pool.len() - leaving,
    }
}

/// Of the nodes of `pool` memwatch drained, the one that keeps its drain
/// when concurrent drains crossed the floor: the lowest name, the same
/// answer on every host.
pub(crate) fn keeper<'a>(pool: &[&'a Node]) -> Option<&'a str> {
    pool.iter()
        .filter(|n| n.drained_by_memwatch())
        .map(|n| n.name.as_str())
        .min()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Nodes by name.
    fn by_name(nodes: &[Node]) -> BTreeMap<&str, &Node> {
        nodes.iter().map(|n| (n.name.as_str(), n)).collect()
    }

    const SHOW: &str = "\
NodeName=n1 Arch=x86_64 CPUTot=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=main Reason=memwatch: worker w1 unhealthy [root@2026-12-01T03:00:00]
NodeName=n2 Arch=x86_64 CPUTot=1 State=IDLE ThreadsPerCore=1 Partitions=main
NodeName=n3 Arch=x86_64 CPUTot=1 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Partitions=main,gpu Reason=Not responding [slurm@2026-12-01T02:00:00]
NodeName=n4 Arch=x86_64 CPUTot=1 State=MIXED ThreadsPerCore=1 Partitions=other
";

    #[test]
    fn the_pool_is_the_partitions_and_gone_is_gone_for_any_reason() {
        let nodes = parse(SHOW);
        assert_eq!(nodes.len(), 4);
        let names = by_name(&nodes);
        let pool = pool(&nodes, names["n2"]);
        let in_pool: Vec<&str> = pool.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(in_pool, ["n1", "n2", "n3"]);
        assert_eq!(
            capacity(&pool),
            Capacity {
                listed: 3,
                leaving: 2,
                running: 1
            }
        );
        assert!(names["n1"].drained_by_memwatch());
        assert!(
            !names["n3"].drained_by_memwatch(),
            "down, not drained by memwatch"
        );
        assert_eq!(keeper(&pool), Some("n1"));
    }
}
