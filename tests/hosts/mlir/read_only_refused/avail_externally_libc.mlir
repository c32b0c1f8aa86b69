// A callee whose body is never emitted (available_externally linkage): libc's swab runs.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  // A body that only reads %a -- but available_externally: the body is never emitted,
  // so the call binds to libc's swab(from, to, n) = (allocated, aligned, offset)
  func.func @swab(%a: memref<1xf32, strided<[1], offset: 4>>) attributes {llvm.linkage = #llvm.linkage<available_externally>, no_inline} {
    %c0 = arith.constant 0 : index
    %x = memref.load %a[%c0] : memref<1xf32, strided<[1], offset: 4>>
    return
  }
  func.func @f(%a: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %v = memref.subview %a[4] [1] [1] : memref<?xf32> to memref<1xf32, strided<[1], offset: 4>>
    func.call @swab(%v) : (memref<1xf32, strided<[1], offset: 4>>) -> ()
    %z = arith.constant 0 : i32
    return %z : i32
  }
}
