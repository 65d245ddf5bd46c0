#![no_std]
// The library target exists so the workspace can resolve this crate; the
// programs live in the binary (src/main.rs).
