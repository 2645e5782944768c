; Hand-written AMDGPU kernel with a loop the optimiser unrolls and vectorises.
source_filename = "reduce_loop_amdgcn.ll"
target triple = "amdgcn-amd-amdhsa"

define amdgpu_kernel void @sum_rows(ptr addrspace(1) %m, ptr addrspace(1) %out, i32 %cols) {
entry:
  %row = call i32 @llvm.amdgcn.workitem.id.x()
  %start = mul i32 %row, %cols
  br label %loop
loop:
  %j = phi i32 [ 0, %entry ], [ %j.next, %loop ]
  %acc = phi float [ 0.0, %entry ], [ %acc.next, %loop ]
  %k = add i32 %start, %j
  %k64 = zext i32 %k to i64
  %p = getelementptr float, ptr addrspace(1) %m, i64 %k64
  %v = load float, ptr addrspace(1) %p
  %acc.next = fadd float %acc, %v
  %j.next = add i32 %j, 1
  %more = icmp slt i32 %j.next, %cols
  br i1 %more, label %loop, label %exit
exit:
  %r64 = zext i32 %row to i64
  %q = getelementptr float, ptr addrspace(1) %out, i64 %r64
  store float %acc.next, ptr addrspace(1) %q
  ret void
}

declare i32 @llvm.amdgcn.workitem.id.x()
