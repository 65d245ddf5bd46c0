//! Rebuild the programs when the bpf-linker binary changes (it is an
//! undeclared dependency of the bpf target).
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo:warning=bpf-linker not found on PATH ({err}); run `cargo xtask setup`")
        }
    }
}
