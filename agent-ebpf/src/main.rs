//! memwatch kernel programs. Entry points are thin: each maps a `try_*`
//! result to a return code; the work is in `programs/`.
#![no_std]
#![no_main]

mod log;
mod maps;
mod programs;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier proves this is unreachable; no panic can be taken in BPF.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
