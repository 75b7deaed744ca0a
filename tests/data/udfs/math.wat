;; Test functions for the WebAssembly UDFs (tests/unit/test_udf.py).
(module
  (memory 1)
  ;; double(x) = 2x
  (func (export "double") (param i64) (result i64)
    local.get 0
    i64.const 2
    i64.mul)
  ;; spin never returns: runs out of fuel
  (func (export "spin") (param i64) (result i64)
    (loop br 0)
    i64.const 0)
;; spin_neg(x) = x, but never returns for a negative x (one bad record in a batch)
  (func (export "spin_neg") (param i64) (result i64)
    (block
      local.get 0
      i64.const 0
      i64.ge_s
      br_if 0
      (loop br 0))
    local.get 0)
  ;; hog grows memory by x pages (64 KiB each) and returns the old size in pages, or -1
  (func (export "hog") (param i32) (result i32)
    local.get 0
    memory.grow)
  ;; ratio(a, b) = a / b as f64
  (func (export "ratio") (param f64 f64) (result f64)
    local.get 0
    local.get 1
    f64.div))
