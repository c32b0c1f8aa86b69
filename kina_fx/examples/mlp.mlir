// A two-layer MLP forward with softmax cross-entropy, every tensor op a call
// of the Kina runtime, so an autograd tape can record it (docs/autograd-abi.md):
//
//   loss = cross_entropy(relu(x @ w1 + b1) @ w2 + b2, labels)
//
// @mlp_loss takes ranked memrefs (llvm.emit_c_interface passes their
// descriptors: _mlir_ciface_mlp_loss) and returns the first non-zero status
// of the runtime calls.  Compiled by kina_fx.compiled.compile_mlir (the
// lowering pipeline of docs/autograd-abi.md); used by `kina-fx demo` and
// benches/bench_compiled_step.py.
module {
  func.func private @runtime_gpu_matmul_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_add_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_relu_f32(memref<*xf32>, memref<*xf32>) -> i32 attributes {llvm.emit_c_interface}
  func.func private @runtime_cross_entropy_f32(memref<*xf32>, memref<*xf32>, memref<*xi64>) -> i32 attributes {llvm.emit_c_interface}

  func.func @mlp_loss(%loss: memref<f32>, %x: memref<?x?xf32>, %labels: memref<?xi64>,
                      %w1: memref<?x?xf32>, %b1: memref<?xf32>,
                      %w2: memref<?x?xf32>, %b2: memref<?xf32>) -> i32 attributes {llvm.emit_c_interface} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %zero = arith.constant 0 : i32
    %n = memref.dim %x, %c0 : memref<?x?xf32>
    %hidden = memref.dim %w1, %c1 : memref<?x?xf32>
    %classes = memref.dim %w2, %c1 : memref<?x?xf32>
    %xw = memref.alloc(%n, %hidden) : memref<?x?xf32>
    %pre = memref.alloc(%n, %hidden) : memref<?x?xf32>
    %h = memref.alloc(%n, %hidden) : memref<?x?xf32>
    %hw = memref.alloc(%n, %classes) : memref<?x?xf32>
    %logits = memref.alloc(%n, %classes) : memref<?x?xf32>
    %ux = memref.cast %x : memref<?x?xf32> to memref<*xf32>
    %uw1 = memref.cast %w1 : memref<?x?xf32> to memref<*xf32>
    %ub1 = memref.cast %b1 : memref<?xf32> to memref<*xf32>
    %uw2 = memref.cast %w2 : memref<?x?xf32> to memref<*xf32>
    %ub2 = memref.cast %b2 : memref<?xf32> to memref<*xf32>
    %ulabels = memref.cast %labels : memref<?xi64> to memref<*xi64>
    %uloss = memref.cast %loss : memref<f32> to memref<*xf32>
    %uxw = memref.cast %xw : memref<?x?xf32> to memref<*xf32>
    %upre = memref.cast %pre : memref<?x?xf32> to memref<*xf32>
    %uh = memref.cast %h : memref<?x?xf32> to memref<*xf32>
    %uhw = memref.cast %hw : memref<?x?xf32> to memref<*xf32>
    %ulogits = memref.cast %logits : memref<?x?xf32> to memref<*xf32>
    %s1 = func.call @runtime_gpu_matmul_f32(%uxw, %ux, %uw1) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok1 = arith.cmpi eq, %s1, %zero : i32
    cf.cond_br %ok1, ^add1, ^done(%s1 : i32)
  ^add1:
    %s2 = func.call @runtime_add_f32(%upre, %uxw, %ub1) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok2 = arith.cmpi eq, %s2, %zero : i32
    cf.cond_br %ok2, ^relu, ^done(%s2 : i32)
  ^relu:
    %s3 = func.call @runtime_relu_f32(%uh, %upre) : (memref<*xf32>, memref<*xf32>) -> i32
    %ok3 = arith.cmpi eq, %s3, %zero : i32
    cf.cond_br %ok3, ^matmul2, ^done(%s3 : i32)
  ^matmul2:
    %s4 = func.call @runtime_gpu_matmul_f32(%uhw, %uh, %uw2) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok4 = arith.cmpi eq, %s4, %zero : i32
    cf.cond_br %ok4, ^add2, ^done(%s4 : i32)
  ^add2:
    %s5 = func.call @runtime_add_f32(%ulogits, %uhw, %ub2) : (memref<*xf32>, memref<*xf32>, memref<*xf32>) -> i32
    %ok5 = arith.cmpi eq, %s5, %zero : i32
    cf.cond_br %ok5, ^loss, ^done(%s5 : i32)
  ^loss:
    %s6 = func.call @runtime_cross_entropy_f32(%uloss, %ulogits, %ulabels) : (memref<*xf32>, memref<*xf32>, memref<*xi64>) -> i32
    cf.br ^done(%s6 : i32)
  ^done(%status: i32):
    memref.dealloc %xw : memref<?x?xf32>
    memref.dealloc %pre : memref<?x?xf32>
    memref.dealloc %h : memref<?x?xf32>
    memref.dealloc %hw : memref<?x?xf32>
    memref.dealloc %logits : memref<?x?xf32>
    return %status : i32
  }
}
