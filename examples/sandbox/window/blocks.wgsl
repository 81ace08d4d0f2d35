// The chunks' material: each vertex's colour, as it is (the light is baked into the colours by the mesher).
// Bevy's standard material computes far more per pixel even when unlit, which software renderers feel.
#import bevy_pbr::forward_io::VertexOutput

@fragment
fn fragment(in: VertexOutput) -> @location(0) vec4<f32> {
#ifdef VERTEX_COLORS
    return in.color;
#else
    return vec4<f32>(1.0, 0.0, 1.0, 1.0);
#endif
}
