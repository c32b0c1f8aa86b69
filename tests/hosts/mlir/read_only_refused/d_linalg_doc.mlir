// A linalg op whose doc string spells operandSegmentSizes.
// (tests/hosts/mlir/test_mlir_read_only.py: no argument it writes may be proven read-only)
#id = affine_map<(i) -> (i)>
module {
  func.func @f(%a: memref<?xf32>, %out: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    linalg.generic {doc = "operandSegmentSizes = array<i32: 2>", indexing_maps = [#id, #id], iterator_types = ["parallel"]}
        ins(%out : memref<?xf32>) outs(%a : memref<?xf32>) {
    ^bb0(%x: f32, %y: f32):
      linalg.yield %x : f32
    }
    %ok = arith.constant 0 : i32
    return %ok : i32
  }
}
