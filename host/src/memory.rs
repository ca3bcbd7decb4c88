//! Giving memory back to the system. With glibc, memory freed by a multi-threaded program
//! stays in its heap arenas until something asks for it back; after a burst (many large
//! calls, a flood of HTTP sessions) the process would keep its peak for good.

/// Large blocks (a big call's arguments or answer) get their own mapping, which goes back
/// to the system when freed. glibc's default raises this threshold to the largest block
/// freed so far (up to 32 MiB), after which a burst of large calls is served from the heap
/// arenas and stays resident long after it ended (`cargo xtask chaos`: 62 MiB 15 s after a
/// burst of 32 × 4 MiB calls, against 26 MiB with a fixed threshold and an idle figure of
/// 23 MiB). Call it at start, before the allocations it is meant for.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "a glibc allocator call")]
pub fn return_large_blocks() {
    // SAFETY: `mallopt` only sets an allocator parameter, to a value glibc documents as
    // valid, and takes the allocator's lock to do it (it is thread-safe).
    let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
    if set != 1 {
        tracing::debug!("mallopt(M_MMAP_THRESHOLD) was refused");
    }
}

/// Returns the free pages of every heap arena to the system, after something large (many
/// sessions) has ended. It walks every arena under its lock, in time that grows with the
/// heap: call it on a blocking thread, once per such event, not per call.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "a glibc allocator call")]
pub fn trim() {
    // SAFETY: `malloc_trim` is thread-safe and only releases memory that is free.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn return_large_blocks() {}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}
