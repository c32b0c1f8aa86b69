// libcall_sinf.mlir without its passthrough attributes: the math.sin of a function f runs is no plain operation.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  memref.global @sink : memref<1xf32> = dense<0.0>
  // Never called in the MLIR: the code generator calls "sinf" for math.sin, and -Bsymbolic
  // binds that call here.  Its parameters are whatever the caller left in the first two registers.
  func.func @sinf(%p: !llvm.ptr, %q: !llvm.ptr) -> f32 {
    %v = arith.constant 42.0 : f32
    llvm.store %v, %q : f32, !llvm.ptr
    return %v : f32
  }
  // only reads %a; at its entry the second register holds %a's aligned pointer
  func.func @g(%a: memref<?xf32>) -> f32 {
    %c0 = arith.constant 0 : index
    %x = memref.load %a[%c0] : memref<?xf32>
    %s = math.sin %x : f32
    return %s : f32
  }
  func.func @f(%a: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %s = func.call @g(%a) : (memref<?xf32>) -> f32
    %k = memref.get_global @sink : memref<1xf32>
    %c0 = arith.constant 0 : index
    memref.store %s, %k[%c0] : memref<1xf32>
    %z = arith.constant 0 : i32
    return %z : i32
  }
}
