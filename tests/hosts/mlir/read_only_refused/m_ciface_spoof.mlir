// A hand-written _mlir_ciface_x; a string spelling llvm.emit_c_interface.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  // no real C interface: the string makes the parser think it has one
  func.func @x(%a: memref<?xf32> {foo.n = "llvm.emit_c_interface"}, %out: memref<?xf32>) -> i32 {
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
  // the real export of that name: writes 7 into a's data through its descriptor
  func.func @_mlir_ciface_x(%da: !llvm.ptr, %dout: !llvm.ptr) -> i32 {
    %p = llvm.getelementptr %da[1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %aligned = llvm.load %p : !llvm.ptr -> !llvm.ptr
    %seven = arith.constant 7.0 : f32
    llvm.store %seven, %aligned : f32, !llvm.ptr
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
