//! The idle agent hands back what a burst freed (issue 28: RSS with 5,000
//! tasks). Its own process: the resident-memory figures it reads are the
//! process's, and no other test allocates beside it.

use memwatch::heap::{Held, KEEP_FREE_BYTES, release_if_kept};

/// A burst's freed memory, fragmented by a few blocks still alive (as
/// task records are among an outbox catch-up's garbage), stays
/// resident until the check hands it back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_burst_freed_between_live_blocks_is_handed_back() {
    const BLOCK: usize = 1024;
    const BLOCKS: usize = 48 * 1024; // 48 MiB
    let mut blocks: Vec<Option<Box<[u8]>>> = (0..BLOCKS)
        .map(|i| Some(vec![(i % 251) as u8; BLOCK].into_boxed_slice()))
        .collect();
    // One block in 32 stays, the last one too: glibc's own trim of the
    // heap's top cannot give any of it back.
    for (i, b) in blocks.iter_mut().enumerate() {
        if i % 32 != 0 && i != BLOCKS - 1 {
            *b = None;
        }
    }
    let before = Held::now().expect("glibc and /proc");
    assert!(
        before.kept_free() > 32 << 20,
        "the freed burst is resident: {before:?}"
    );
    let released = release_if_kept().expect("over the threshold");
    assert!(released >= 24 << 20, "handed back {released} bytes");
    let after = Held::now().expect("glibc and /proc");
    assert!(
        after.kept_free() <= KEEP_FREE_BYTES + (4 << 20),
        "kept after the trim: {after:?}"
    );
    let live = blocks.iter().flatten().count();
    assert_eq!(live, BLOCKS / 32 + 1);
    drop(blocks);
}
