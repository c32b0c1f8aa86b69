// A vector parameter no C declaration can spell: the declared positions are not MLIR's.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  // C interface: _mlir_ciface_f(<4 x float> v /* xmm0 */, desc *a /* rdi */, desc *b /* rsi */)
  // cffi has no vector type: a declaration without v, (desc *a, desc *b), is ABI-compatible,
  // but the verdict's positions are MLIR's: {0 (v, unused), 2 (b)}
  func.func @f(%v: vector<4xf32>, %a: memref<?xf32>, %b: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %x = memref.load %b[%c0] : memref<?xf32>
    memref.store %x, %a[%c0] : memref<?xf32>
    %z = arith.constant 0 : i32
    return %z : i32
  }
}
