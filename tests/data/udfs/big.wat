;; Starts with 20 pages (1.25 MiB) of linear memory: refused under a smaller ceiling.
(module
  (memory 20)
  (func (export "double") (param i64) (result i64) local.get 0 i64.const 2 i64.mul))
