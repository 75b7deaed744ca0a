;; Test functions for the WebAssembly UDFs (tests/unit/test_udf.py).
;; A function f called a column at a time exports f_batch(n, out, arg1, ...): each
;; argument an array of n little-endian values at its pointer, the results written at out.
(module
  (memory (export "memory") 1)
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
    f64.div)
  ;; double_batch: out[i] = 2 * a[i]
  (func (export "double_batch") (param $n i32) (param $out i32) (param $a i32)
    (local $i i32)
    (block $done
      (loop $next
        local.get $i
        local.get $n
        i32.ge_u
        br_if $done
        local.get $out
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        local.get $a
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        i64.load
        i64.const 2
        i64.mul
        i64.store
        local.get $i
        i32.const 1
        i32.add
        local.set $i
        br $next)))
  ;; spin_neg_batch: out[i] = a[i], but never returns when any a[i] is negative
  (func (export "spin_neg_batch") (param $n i32) (param $out i32) (param $a i32)
    (local $i i32) (local $v i64)
    (block $done
      (loop $next
        local.get $i
        local.get $n
        i32.ge_u
        br_if $done
        local.get $a
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        i64.load
        local.set $v
        (block
          local.get $v
          i64.const 0
          i64.ge_s
          br_if 0
          (loop br 0))
        local.get $out
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        local.get $v
        i64.store
        local.get $i
        i32.const 1
        i32.add
        local.set $i
        br $next)))
  ;; ratio_batch: out[i] = a[i] / b[i] as f64
  (func (export "ratio_batch") (param $n i32) (param $out i32) (param $a i32) (param $b i32)
    (local $i i32) (local $at i32)
    (block $done
      (loop $next
        local.get $i
        local.get $n
        i32.ge_u
        br_if $done
        local.get $i
        i32.const 8
        i32.mul
        local.set $at
        local.get $out
        local.get $at
        i32.add
        local.get $a
        local.get $at
        i32.add
        f64.load
        local.get $b
        local.get $at
        i32.add
        f64.load
        f64.div
        f64.store
        local.get $i
        i32.const 1
        i32.add
        local.set $i
        br $next)))
  ;; trap_batch: an unreachable in the column call (not fuel): the batch fails
  (func (export "trap") (param i64) (result i64)
    unreachable)
  (func (export "trap_batch") (param i32 i32 i32)
    unreachable)
  ;; bad_batch has the wrong shape for a column call: refused at load
  (func (export "bad") (param i64) (result i64)
    local.get 0)
  (func (export "bad_batch") (param i32) (result i32)
    local.get 0)
  ;; slow(x) counts down from x, then returns x: about 5 instructions a step
  (func $slow (export "slow") (param $x i64) (result i64)
    (local $k i64)
    local.get $x
    local.set $k
    (block $done
      (loop $next
        local.get $k
        i64.eqz
        br_if $done
        local.get $k
        i64.const 1
        i64.sub
        local.set $k
        br $next))
    local.get $x)
  (func (export "slow_batch") (param $n i32) (param $out i32) (param $a i32)
    (local $i i32)
    (block $done
      (loop $next
        local.get $i
        local.get $n
        i32.ge_u
        br_if $done
        local.get $out
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        local.get $a
        local.get $i
        i32.const 8
        i32.mul
        i32.add
        i64.load
        call $slow
        i64.store
        local.get $i
        i32.const 1
        i32.add
        local.set $i
        br $next))))
