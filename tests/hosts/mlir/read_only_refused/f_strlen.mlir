// A module function named like another C library function (strlen): bound locally.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
module {
  func.func @strlen(%p: memref<?xf32, strided<[1], offset: ?>>, %o: memref<?xf32>) attributes {passthrough = ["noinline", "optnone"]} {
    %c0 = arith.constant 0 : index
    %v = memref.load %p[%c0] : memref<?xf32, strided<[1], offset: ?>>
    memref.store %v, %o[%c0] : memref<?xf32>
    return
  }
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c3 = arith.constant 3 : index
    %c1 = arith.constant 1 : index
    %sv = memref.subview %a[%c3] [%c1] [1] : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    func.call @strlen(%sv, %out) : (memref<?xf32, strided<[1], offset: ?>>, memref<?xf32>) -> ()
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
