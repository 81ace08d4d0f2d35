//! Persistence: the world store (a directory per world, typed documents, atomic durable writes, same-world
//! ordering across visits, a lock file per world).
