;; A module that asks for a capability (WASI's fd_write): refused at load.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (func (export "f") (param i64) (result i64) local.get 0))
